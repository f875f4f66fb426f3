//! `metadata.json`: the schema of a preprocessed database.
//!
//! Read once at open and kept in memory. Field order is fixed by these structs
//! (and maps are `BTreeMap`), so serialising the same metadata always yields
//! the same bytes — the content hash depends on that.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a column's values are encoded and which decoder head predicts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum SemanticType {
    Numerical,
    Boolean,
    Timestamp,
    Categorical,
    Text,
    Identifier,
    Ignored,
}

impl SemanticType {
    /// The code used in batch tensors (`semantic_types`, `target_stype`):
    /// numerical 0, boolean 1, timestamp 2, categorical 3, text 4. Types that
    /// produce no cells have none.
    pub fn code(self) -> Option<u8> {
        match self {
            SemanticType::Numerical => Some(0),
            SemanticType::Boolean => Some(1),
            SemanticType::Timestamp => Some(2),
            SemanticType::Categorical => Some(3),
            SemanticType::Text => Some(4),
            SemanticType::Identifier | SemanticType::Ignored => None,
        }
    }

    /// Does a column of this type become cells (and get stored)?
    pub fn is_stored(self) -> bool {
        self.code().is_some()
    }

    /// Can a task predict a value of this type (has a decoder head)?
    pub fn is_target(self) -> bool {
        matches!(self.code(), Some(0..=3))
    }

    /// Size in bytes of one stored value.
    pub fn value_size(self) -> usize {
        match self {
            SemanticType::Numerical => 4,
            SemanticType::Boolean => 1,
            SemanticType::Timestamp => 8,
            SemanticType::Categorical | SemanticType::Text => 4,
            SemanticType::Identifier | SemanticType::Ignored => 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SemanticType::Numerical => "numerical",
            SemanticType::Boolean => "boolean",
            SemanticType::Timestamp => "timestamp",
            SemanticType::Categorical => "categorical",
            SemanticType::Text => "text",
            SemanticType::Identifier => "identifier",
            SemanticType::Ignored => "ignored",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "numerical" => SemanticType::Numerical,
            "boolean" => SemanticType::Boolean,
            "timestamp" => SemanticType::Timestamp,
            "categorical" => SemanticType::Categorical,
            "text" => SemanticType::Text,
            "identifier" => SemanticType::Identifier,
            "ignored" => SemanticType::Ignored,
            _ => return None,
        })
    }
}

/// Summary statistics of a column (of its non-null source values).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    pub count: u64,
    pub null_count: u64,
    /// Mean and standard deviation used for z-scoring (numerical), in source
    /// units; for timestamps in µs since the epoch.
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
}

/// One column of the database, global across tables. Task target columns that
/// are not table columns (SQL/RelBench tasks) are *virtual*: `slot` is `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnMeta {
    /// Global column index (position in `Metadata::columns`).
    pub idx: u32,
    pub table: u32,
    pub name: String,
    pub stype: SemanticType,
    /// The source's type name (e.g. `DECIMAL(15,2)`), for inspection.
    pub source_type: String,
    /// Was `stype` inferred (true) or declared in a schema file (false)?
    pub inferred: bool,
    /// Index of the column's section pair in `tables/<table>.bin`.
    pub slot: Option<u32>,
    pub stats: ColumnStats,
    /// Categorical: the column's contiguous block in the categorical table.
    pub cat_emb_start: u32,
    pub cat_emb_count: u32,
    /// Categorical: the category values, `cat_emb_start + i` ↔ `categories[i]`.
    pub categories: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForeignKeyMeta {
    pub column: String,
    /// Referenced table index.
    pub references: u32,
    /// Edges created (non-null, resolved values).
    pub num_edges: u64,
    pub num_null: u64,
    /// Non-null values that match no primary key (edge dropped).
    pub num_dangling: u64,
}

/// A column that does not become cells, kept for inspection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnstoredColumn {
    pub name: String,
    pub stype: SemanticType,
    pub source_type: String,
    pub inferred: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableMeta {
    pub idx: u32,
    pub name: String,
    /// Relative path of the table file (derived from `idx`).
    pub file: String,
    pub row_offset: u64,
    pub num_rows: u64,
    pub primary_key: Option<String>,
    pub time_column: Option<String>,
    pub foreign_keys: Vec<ForeignKeyMeta>,
    /// Global indices of the stored columns, in table order.
    pub columns: Vec<u32>,
    pub unstored_columns: Vec<UnstoredColumn>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskMeta {
    pub idx: u32,
    pub name: String,
    /// `cell` (mask a column of the anchor table), `sql` (schema-declared
    /// query) or `relbench` (imported label table).
    pub kind: String,
    pub file: String,
    pub anchor_table: u32,
    /// Global column index of the target (a table column for `cell` tasks, a
    /// virtual column otherwise).
    pub target_column: u32,
    pub target_stype: SemanticType,
    pub num_seeds: u64,
    pub num_null_targets: u64,
    /// Does any seed carry an observation time (vs. all `i64::MAX`)?
    pub temporal: bool,
    pub query: Option<String>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimestampStats {
    /// Mean and std of all non-null timestamp cells in the database (µs).
    pub mean_us: f64,
    pub std_us: f64,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedderMeta {
    pub name: String,
    pub dim: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileDigest {
    pub bytes: u64,
    /// xxh3-64 payload checksum, hex.
    pub checksum: String,
}

/// The whole `metadata.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub format_version: u32,
    /// xxh3-128 (hex) of this document with `content_hash` empty; see
    /// [`crate::format`].
    pub content_hash: String,
    pub producer: String,
    pub source: String,
    pub embedder: EmbedderMeta,
    pub num_rows: u64,
    pub num_edges: u64,
    pub num_text_embeddings: u64,
    pub num_categorical_embeddings: u64,
    pub timestamp_stats: TimestampStats,
    pub tables: Vec<TableMeta>,
    pub columns: Vec<ColumnMeta>,
    pub tasks: Vec<TaskMeta>,
    pub files: BTreeMap<String, FileDigest>,
}

impl Metadata {
    /// The content hash of this metadata (ignoring the stored hash).
    pub fn compute_content_hash(&self) -> String {
        let mut m = self.clone();
        m.content_hash.clear();
        let bytes = serde_json::to_vec(&m).expect("metadata serialises");
        format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
    }

    pub fn table_by_name(&self, name: &str) -> Option<&TableMeta> {
        self.tables.iter().find(|t| t.name == name)
    }

    pub fn task_by_name(&self, name: &str) -> Option<&TaskMeta> {
        self.tasks.iter().find(|t| t.name == name)
    }
}
