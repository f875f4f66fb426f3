//! What the front end hands the [`DatabaseWriter`](super::DatabaseWriter):
//! typed columns, foreign keys, tables and tasks.
//!
//! Invariants: every input borrows the caller's arrays (NumPy buffers or
//! spilled maps); the writer reads them a chunk at a time and never copies
//! one whole. Validity is one byte per row (`0` = null). Never: logic here;
//! these are plain records, checked where they are written.

use crate::format::SemanticType;

/// Typed values of one column (or task target), as the front end supplies them.
/// `valid[i] != 0` marks row `i` non-null.
pub enum ColumnData<'a> {
    /// Identifier / ignored columns: not stored.
    Unstored,
    /// f64 values (z-scored on write).
    Numerical {
        /// One value per row.
        values: &'a [f64],
        /// Validity per row (1 = present).
        valid: &'a [u8],
    },
    /// 0/1 values.
    Boolean {
        /// One value per row.
        values: &'a [u8],
        /// Validity per row (1 = present).
        valid: &'a [u8],
    },
    /// µs since the Unix epoch.
    Timestamp {
        /// Microseconds since the epoch.
        values: &'a [i64],
        /// Validity per row (1 = present).
        valid: &'a [u8],
    },
    /// `codes[i]` indexes `categories`.
    Categorical {
        /// Index into `categories` per row.
        codes: &'a [u32],
        /// Validity per row (1 = present).
        valid: &'a [u8],
        /// The category names.
        categories: Vec<String>,
    },
    /// Text values already interned by [`DatabaseWriter::intern_texts`] while
    /// the column was streamed: `ids[i]` is row `i`'s global text id.
    TextIds {
        /// Global text id of each row (ignored where not valid).
        ids: &'a [u32],
        /// Validity per row (1 = present).
        valid: &'a [u8],
    },
    /// `codes[i]` indexes a dictionary given as Arrow `large_string` buffers.
    Text {
        /// Index of each row's string in `offsets`.
        codes: &'a [u32],
        /// Validity per row (1 = present).
        valid: &'a [u8],
        /// Arrow-style offsets into `bytes`.
        offsets: &'a [i64],
        /// UTF-8 bytes of the distinct strings.
        bytes: &'a [u8],
    },
}

/// One column of a table to write.
pub struct ColumnInput<'a> {
    /// Column name.
    pub name: String,
    /// Semantic type.
    pub stype: SemanticType,
    /// Type in the source database.
    pub source_type: String,
    /// Whether the type was inferred rather than declared.
    pub inferred: bool,
    /// The values.
    pub data: ColumnData<'a>,
}

/// A foreign key of a table to write.
pub struct ForeignKeyInput<'a> {
    /// The referencing column.
    pub column: String,
    /// Name of the referenced table.
    pub references: String,
    /// Row index in the referenced table, `-1` where null or dangling.
    pub parents: &'a [i64],
    /// Rows whose key is null.
    pub num_null: u64,
    /// Rows whose key matches no parent row.
    pub num_dangling: u64,
}

/// One table to write.
pub struct TableInput<'a> {
    /// Table name.
    pub name: String,
    /// Rows.
    pub num_rows: usize,
    /// Primary key column, if any.
    pub primary_key: Option<String>,
    /// Time column, if any.
    pub time_column: Option<String>,
    /// Row times in µs, `i64::MIN` where the row has none.
    pub row_time: &'a [i64],
    /// Columns, in source order.
    pub columns: Vec<ColumnInput<'a>>,
    /// Foreign keys.
    pub foreign_keys: Vec<ForeignKeyInput<'a>>,
    /// Identifies the source and settings this table was built from; a
    /// restarted run reuses the staged table only when it matches.
    pub fingerprint: String,
}

/// What a task predicts.
pub enum TaskTarget<'a> {
    /// Values supplied by the front end (SQL or imported labels); they become
    /// a virtual column of the anchor table.
    Values {
        /// Semantic type of the target.
        stype: SemanticType,
        /// Target value per seed.
        data: ColumnData<'a>,
    },
}

/// One task to write.
pub struct TaskInput<'a> {
    /// Task name.
    pub name: String,
    /// Task kind (e.g. `cell`, `query`).
    pub kind: String,
    /// Table whose rows are the seeds.
    pub anchor_table: String,
    /// Row index within the anchor table.
    pub anchor_rows: &'a [u32],
    /// Observation time in µs; `i64::MAX` = non-temporal seed.
    pub obs_time: &'a [i64],
    /// Where the target comes from.
    pub target: TaskTarget<'a>,
    /// The query that defined the task, if any.
    pub query: Option<String>,
    /// What the task predicts.
    pub description: Option<String>,
    /// Each seed's stored split code (0 train, 1 val, 2 test), kept instead
    /// of the hash split (RelBench: the label file each row came from).
    pub splits: Option<&'a [u8]>,
}

/// What `begin_table` needs to know before the first column arrives.
pub struct TableSpec {
    /// Table name.
    pub name: String,
    /// Rows.
    pub num_rows: usize,
    /// Primary key column, if any.
    pub primary_key: Option<String>,
    /// Time column, if any.
    pub time_column: Option<String>,
    /// Identifies the source and settings (see [`TableInput::fingerprint`]).
    pub fingerprint: String,
    /// Columns that will be stored (not identifier/ignored): the file's
    /// section count is fixed up front.
    pub num_stored: usize,
}
