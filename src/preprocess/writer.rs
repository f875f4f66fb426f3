//! [`DatabaseWriter`]: accumulates tables and tasks, writes the format.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use half::f16;
use serde::{Deserialize, Serialize};

use super::graph::{build_reverse, write_forward, write_reverse};
use super::spill::SpillArray;
use super::stats::{column_stats, RunningStats};
use super::texts::TextTable;
use crate::error::{Error, Result};
use crate::format::bit;
use crate::format::{
    pack_bits, ColumnMeta, ColumnStats, EmbedderMeta, FileDigest, FileKind, FileWriter,
    ForeignKeyMeta, MappedFile, Metadata, Section, SemanticType, TableMeta, TaskMeta,
    TimestampStats, FORMAT_VERSION,
};
use crate::seeds::Split;

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

/// What a staged table leaves behind so a restarted run can skip it.
#[derive(Serialize, Deserialize)]
struct TablePart {
    fingerprint: String,
    table: TableMeta,
    fk_refs: Vec<String>,
    columns: Vec<ColumnMeta>,
    categories_added: Vec<String>,
    ts: (u64, f64, f64, f64, f64),
    digest: FileDigest,
}

/// Builds a database directory. See the module docs of [`crate::preprocess`].
pub struct DatabaseWriter {
    out: PathBuf,
    staging: PathBuf,
    source: String,
    embedder: EmbedderMeta,
    tables: Vec<TableMeta>,
    fk_refs: Vec<Vec<String>>,
    columns: Vec<ColumnMeta>,
    tasks: Vec<TaskMeta>,
    files: BTreeMap<String, FileDigest>,
    /// Rows of the tables added so far.
    num_rows: u64,
    /// Per table, its staged graph inputs (`parts/<t>.bin`, mapped): row
    /// times, then per foreign key the parent row within the referenced
    /// table (`u32::MAX` = none). Read from the page cache, never held.
    graph_parts: Vec<MappedFile>,
    /// Distinct text values, in id order (see [`TextTable`]).
    texts: TextTable,
    cat_strings: Vec<String>,
    ts_stats: RunningStats,
    resumed: usize,
    /// The table between `begin_table` and `end_table`.
    open: Option<OpenTable>,
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

/// A table between `begin_table` and `end_table`.
struct OpenTable {
    spec: TableSpec,
    t: u32,
    row_offset: u64,
    file: String,
    writer: FileWriter,
    text_before: usize,
    cats_before: usize,
    cols_before: usize,
    stored: Vec<u32>,
    unstored: Vec<crate::format::UnstoredColumn>,
    ts_table: RunningStats,
    seen: std::collections::HashSet<String>,
}

fn io<P: AsRef<Path>>(p: P) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(p.as_ref(), e)
}

/// A table or column name must be printable and path-free. Files are named by
/// index, so this is not what keeps the directory safe; it keeps names
/// portable into metadata, metric labels and SQL.
fn check_name(kind: &str, name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.len() > 255
        || name
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\')
        || name == "."
        || name == "..";
    if bad {
        return Err(Error::Preprocess(format!(
            "unsafe {kind} name {name:?}: names must be 1-255 printable characters without '/', '\\' or control characters, and not '.' or '..'"
        )));
    }
    Ok(())
}

/// Values per buffered write of a staged part's foreign-key section.
const PART_CHUNK: usize = 1 << 16;

/// A parent row as the front end gives it (`-1` for none) as a stored row
/// id, `None` when it has no parent (or no representable one).
fn parent_row(p: i64) -> Option<u32> {
    u32::try_from(p).ok().filter(|&p| p != u32::MAX)
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::Preprocess(format!(
            "{what}: {got} values, expected {want}"
        )));
    }
    Ok(())
}

fn digest(len: u64, checksum: u64) -> FileDigest {
    FileDigest {
        bytes: len,
        checksum: format!("{checksum:016x}"),
    }
}

/// Rows encoded per buffered write. A multiple of 8, so the validity bitmaps
/// of consecutive chunks concatenate into the column's bitmap. A column is
/// streamed into its file this way, never encoded whole in memory (that copy
/// was 4-8 bytes per row of the largest table: gigabytes at 10^9 rows).
const ENCODE_CHUNK: usize = 1 << 16;

/// How a column's stored values follow from its input, fixed by the first
/// pass over it ([`DatabaseWriter::scan`]).
enum Encoding {
    /// z-scored f32; non-finite values are null.
    Numerical { mean: f64, scale: f64 },
    /// 0/1 bytes.
    Boolean,
    /// µs since the epoch as i64.
    Timestamp,
    /// Global category index `start + code`.
    Categorical { start: u32 },
    /// Global text id, as given.
    TextIds,
    /// Global text id of each dictionary code.
    TextDict { global: Vec<u32> },
}

/// A column's first pass: its statistics and how to encode it.
struct Scanned {
    stats: ColumnStats,
    ts: Option<RunningStats>,
    encoding: Encoding,
}

/// The first valid row whose id is at least `bound` (an id out of range),
/// and that id.
fn first_at_least(ids: &[u32], valid: &[u8], bound: usize) -> Option<(usize, u32)> {
    ids.iter()
        .zip(valid)
        .position(|(&id, &v)| v != 0 && id as usize >= bound)
        .map(|i| (i, ids[i]))
}

/// Stats of a column stored as ids (categorical, text): counts only.
fn count_stats(n: usize, valid: &[u8]) -> ColumnStats {
    let nonnull = valid.iter().filter(|&&v| v != 0).count() as u64;
    ColumnStats {
        count: nonnull,
        null_count: n as u64 - nonnull,
        ..Default::default()
    }
}

/// Write one section of `n` values, a chunk of rows at a time: `fill`
/// appends the encoded values of the rows it is given.
fn stream_values<T: bytemuck::Pod>(
    w: &mut FileWriter,
    n: usize,
    mut fill: impl FnMut(std::ops::Range<usize>, &mut Vec<T>),
) -> Result<()> {
    w.begin_section()?;
    let mut buf: Vec<T> = Vec::with_capacity(ENCODE_CHUNK.min(n));
    for a in (0..n).step_by(ENCODE_CHUNK) {
        buf.clear();
        fill(a..(a + ENCODE_CHUNK).min(n), &mut buf);
        w.append(Section::of(&buf))?;
    }
    Ok(())
}

/// Write the validity bitmap of `n` rows, a chunk at a time.
fn stream_validity(w: &mut FileWriter, n: usize, ok: impl Fn(usize) -> bool) -> Result<()> {
    w.begin_section()?;
    for a in (0..n).step_by(ENCODE_CHUNK) {
        w.append(Section(&pack_bits((a..(a + ENCODE_CHUNK).min(n)).map(&ok))))?;
    }
    Ok(())
}

/// Stored ids, 0 where null: `id` maps a valid row's input to its id.
fn stream_ids(
    w: &mut FileWriter,
    n: usize,
    input: &[u32],
    valid: &[u8],
    id: impl Fn(u32) -> u32,
) -> Result<()> {
    stream_values(w, n, |r, buf: &mut Vec<u32>| {
        let rows = input[r.clone()].iter().zip(&valid[r]);
        buf.extend(rows.map(|(&c, &v)| if v != 0 { id(c) } else { 0 }));
    })?;
    stream_validity(w, n, |i| valid[i] != 0)
}

impl Encoding {
    /// Write a column's two sections, values then validity bitmap, a chunk
    /// at a time. `data` is the input [`DatabaseWriter::scan`] checked and
    /// this encoding came from.
    fn write(&self, w: &mut FileWriter, n: usize, data: &ColumnData<'_>) -> Result<()> {
        match (self, data) {
            (&Encoding::Numerical { mean, scale }, ColumnData::Numerical { values, valid }) => {
                let good = |i: usize| valid[i] != 0 && values[i].is_finite();
                stream_values(w, n, |r, buf: &mut Vec<f32>| {
                    buf.extend(r.map(|i| {
                        if good(i) {
                            ((values[i] - mean) / scale) as f32
                        } else {
                            0.0
                        }
                    }));
                })?;
                stream_validity(w, n, good)
            }
            (Encoding::Boolean, ColumnData::Boolean { values, valid }) => {
                stream_values(w, n, |r, buf: &mut Vec<u8>| {
                    let rows = values[r.clone()].iter().zip(&valid[r]);
                    buf.extend(rows.map(|(&x, &v)| (v != 0 && x != 0) as u8));
                })?;
                stream_validity(w, n, |i| valid[i] != 0)
            }
            (Encoding::Timestamp, ColumnData::Timestamp { values, valid }) => {
                stream_values(w, n, |r, buf: &mut Vec<i64>| {
                    let rows = values[r.clone()].iter().zip(&valid[r]);
                    buf.extend(rows.map(|(&x, &v)| if v != 0 { x } else { 0 }));
                })?;
                stream_validity(w, n, |i| valid[i] != 0)
            }
            (&Encoding::Categorical { start }, ColumnData::Categorical { codes, valid, .. }) => {
                stream_ids(w, n, codes, valid, |c| start + c)
            }
            (Encoding::TextIds, ColumnData::TextIds { ids, valid }) => {
                stream_ids(w, n, ids, valid, |id| id)
            }
            (Encoding::TextDict { global }, ColumnData::Text { codes, valid, .. }) => {
                stream_ids(w, n, codes, valid, |c| global[c as usize])
            }
            _ => unreachable!("an encoding is written with the data it was scanned from"),
        }
    }
}

impl DatabaseWriter {
    /// Start writing to `out` (staged in `<out>.partial`). An existing
    /// staging directory is kept for [`resume_table`](Self::resume_table).
    pub fn new(out: impl AsRef<Path>, source: &str, embedder: &str, dim: u32) -> Result<Self> {
        let out = out.as_ref().to_path_buf();
        let name = out
            .file_name()
            .ok_or_else(|| {
                Error::invalid(
                    "out_dir",
                    format!("{} has no final component", out.display()),
                )
            })?
            .to_string_lossy()
            .into_owned();
        let staging = out.with_file_name(format!("{name}.partial"));
        for d in ["", "tables", "tasks", "parts", "scratch"] {
            let p = staging.join(d);
            fs::create_dir_all(&p).map_err(io(&p))?;
        }
        // Task files and finished-database files are never reused.
        let tasks_dir = staging.join("tasks");
        fs::remove_dir_all(&tasks_dir).map_err(io(&tasks_dir))?;
        fs::create_dir_all(&tasks_dir).map_err(io(&tasks_dir))?;
        let texts = TextTable::spilled(&staging.join("scratch"))?;
        Ok(DatabaseWriter {
            out,
            staging,
            source: source.to_string(),
            embedder: EmbedderMeta {
                name: embedder.to_string(),
                dim,
            },
            tables: vec![],
            fk_refs: vec![],
            columns: vec![],
            tasks: vec![],
            files: BTreeMap::new(),
            num_rows: 0,
            graph_parts: vec![],
            texts,
            cat_strings: vec![],
            ts_stats: RunningStats::default(),
            resumed: 0,
            open: None,
        })
    }

    /// The staging directory (`<out>.partial`).
    pub fn staging_dir(&self) -> &Path {
        &self.staging
    }
    /// Tables added so far.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }
    /// Tables reused from a previous interrupted run.
    pub fn num_resumed(&self) -> usize {
        self.resumed
    }
    /// Index of the table named `name`.
    pub fn table_index(&self, name: &str) -> Option<usize> {
        self.tables.iter().position(|t| t.name == name)
    }
    /// Column metadata so far.
    pub fn columns(&self) -> &[ColumnMeta] {
        &self.columns
    }
    /// Table metadata so far.
    pub fn tables(&self) -> &[TableMeta] {
        &self.tables
    }

    /// The first pass over a column: checks its lengths and values, computes
    /// its statistics, and fixes its [`Encoding`] (interning a text
    /// dictionary). Nothing per row is kept; [`Encoding::write`] is the
    /// second pass.
    fn scan(&mut self, what: &str, n: usize, data: &ColumnData<'_>) -> Result<Scanned> {
        let valid_of =
            |valid: &[u8]| -> Result<()> { check_len(&format!("{what} validity"), valid.len(), n) };
        Ok(match data {
            ColumnData::Unstored => unreachable!("unstored columns are not encoded"),
            ColumnData::Numerical { values, valid } => {
                check_len(what, values.len(), n)?;
                valid_of(valid)?;
                let (rs, stats) =
                    column_stats(values.iter().zip(valid.iter()).map(|(&x, &v)| (x, v != 0)));
                Scanned {
                    encoding: Encoding::Numerical {
                        mean: rs.mean,
                        scale: rs.scale(),
                    },
                    stats,
                    ts: None,
                }
            }
            ColumnData::Boolean { values, valid } => {
                check_len(what, values.len(), n)?;
                valid_of(valid)?;
                let (_, stats) = column_stats(
                    values
                        .iter()
                        .zip(valid.iter())
                        .map(|(&x, &v)| ((x != 0) as u8 as f64, v != 0)),
                );
                Scanned {
                    encoding: Encoding::Boolean,
                    stats,
                    ts: None,
                }
            }
            ColumnData::Timestamp { values, valid } => {
                check_len(what, values.len(), n)?;
                valid_of(valid)?;
                let (rs, stats) = column_stats(
                    values
                        .iter()
                        .zip(valid.iter())
                        .map(|(&x, &v)| (x as f64, v != 0)),
                );
                Scanned {
                    encoding: Encoding::Timestamp,
                    stats,
                    ts: Some(rs),
                }
            }
            ColumnData::Categorical {
                codes,
                valid,
                categories,
            } => {
                check_len(what, codes.len(), n)?;
                valid_of(valid)?;
                let k = categories.len() as u32;
                if let Some((i, c)) = first_at_least(codes, valid, k as usize) {
                    return Err(Error::Preprocess(format!(
                        "{what}: row {i} has category code {c}, only {k} categories"
                    )));
                }
                let counted = count_stats(n, valid);
                Scanned {
                    encoding: Encoding::Categorical {
                        start: self.cat_strings.len() as u32,
                    },
                    stats: ColumnStats {
                        max: (k.saturating_sub(1)) as f64,
                        ..counted
                    },
                    ts: None,
                }
            }
            ColumnData::TextIds { ids, valid } => {
                check_len(what, ids.len(), n)?;
                valid_of(valid)?;
                let known = self.texts.len();
                if let Some((i, id)) = first_at_least(ids, valid, known) {
                    return Err(Error::Preprocess(format!(
                        "{what}: row {i} has text id {id}, only {known} texts interned"
                    )));
                }
                Scanned {
                    encoding: Encoding::TextIds,
                    stats: count_stats(n, valid),
                    ts: None,
                }
            }
            ColumnData::Text {
                codes,
                valid,
                offsets,
                bytes,
            } => {
                check_len(what, codes.len(), n)?;
                valid_of(valid)?;
                let dict_len = offsets.len().saturating_sub(1);
                let global = intern_dictionary(&mut self.texts, what, offsets, bytes)?;
                if let Some((i, c)) = first_at_least(codes, valid, dict_len) {
                    return Err(Error::Preprocess(format!(
                        "{what}: row {i} has text code {c}, dictionary has {dict_len} entries"
                    )));
                }
                Scanned {
                    encoding: Encoding::TextDict { global },
                    stats: count_stats(n, valid),
                    ts: None,
                }
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn new_column(
        &mut self,
        table: u32,
        name: &str,
        stype: SemanticType,
        source_type: &str,
        inferred: bool,
        slot: Option<u32>,
        stats: ColumnStats,
        categories: Vec<String>,
    ) -> u32 {
        let idx = self.columns.len() as u32;
        let (cat_emb_start, cat_emb_count) = if stype == SemanticType::Categorical {
            let start = self.cat_strings.len() as u32;
            for c in &categories {
                self.cat_strings.push(format!("{name}: {c}"));
            }
            (start, categories.len() as u32)
        } else {
            (0, 0)
        };
        self.columns.push(ColumnMeta {
            idx,
            table,
            name: name.to_string(),
            stype,
            source_type: source_type.to_string(),
            inferred,
            slot,
            stats,
            cat_emb_start,
            cat_emb_count,
            categories,
        });
        idx
    }

    /// Reuse table number `num_tables()` from an interrupted run if it was
    /// staged with the same fingerprint. Returns whether it was reused; when
    /// not, every staged table from that index on is discarded.
    pub fn resume_table(&mut self, fingerprint: &str) -> Result<bool> {
        let t = self.tables.len();
        // A table that cannot be resumed (or fails to read back) is rebuilt.
        if let Ok(true) = self.try_resume(t, fingerprint) {
            self.resumed += 1;
            Ok(true)
        } else {
            self.discard_parts_from(t)?;
            Ok(false)
        }
    }

    /// Table `t`'s row times (from its staged part).
    fn table_row_time(&self, t: usize) -> Result<&[i64]> {
        let n = self.tables[t].num_rows as usize;
        self.graph_parts[t].section(0, Some(n))
    }

    /// Table `t`'s parent rows through its foreign key `j` (from its staged
    /// part), local to the referenced table, `u32::MAX` for none.
    fn table_parents(&self, t: usize, j: usize) -> Result<&[u32]> {
        let n = self.tables[t].num_rows as usize;
        self.graph_parts[t].section(1 + j, Some(n))
    }

    fn discard_parts_from(&self, t: usize) -> Result<()> {
        let parts = self.staging.join("parts");
        for entry in fs::read_dir(&parts).map_err(io(&parts))? {
            let entry = entry.map_err(io(&parts))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let idx = name.split('.').next().and_then(|s| s.parse::<usize>().ok());
            if idx.is_none_or(|i| i >= t) {
                let p = entry.path();
                fs::remove_file(&p).map_err(io(&p))?;
                if let Some(i) = idx {
                    let tf = self.staging.join(format!("tables/{i}.bin"));
                    if tf.exists() {
                        fs::remove_file(&tf).map_err(io(&tf))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn try_resume(&mut self, t: usize, fingerprint: &str) -> Result<bool> {
        let json_path = self.staging.join(format!("parts/{t}.json"));
        let Ok(raw) = fs::read(&json_path) else {
            return Ok(false);
        };
        let part: TablePart =
            serde_json::from_slice(&raw).map_err(|e| Error::format(&json_path, e.to_string()))?;
        if part.fingerprint != fingerprint
            || part.table.idx as usize != t
            || part.table.row_offset != self.num_rows
        {
            return Ok(false);
        }
        let table_file = MappedFile::open(
            &self.staging.join(format!("tables/{t}.bin")),
            FileKind::Table,
            Some(2 * part.columns.len()),
        )?;
        // A staged part is reused only if its bytes still hash to what was
        // recorded when it was written (opening no longer hashes payloads).
        if format!("{:016x}", table_file.payload_checksum()) != part.digest.checksum
            || table_file.verify_payload(&mut |_| {}).is_err()
        {
            return Ok(false);
        }
        let n = part.table.num_rows as usize;
        let k = part.fk_refs.len();
        let graph_part = MappedFile::open(
            &self.staging.join(format!("parts/{t}.bin")),
            FileKind::Graph,
            Some(k + 3),
        )?;
        if graph_part.verify_payload(&mut |_| {}).is_err() {
            return Ok(false);
        }
        // Checks passed: apply. Column indices and category offsets must line
        // up with what this run has allocated so far.
        if part
            .columns
            .first()
            .is_some_and(|c| c.idx as usize != self.columns.len())
        {
            return Ok(false);
        }
        graph_part.section::<i64>(0, Some(n))?;
        for j in 0..k {
            graph_part.section::<u32>(1 + j, Some(n))?;
        }
        let offs: &[u64] = graph_part.section(k + 1, None)?;
        let bytes: &[u8] = graph_part.section(k + 2, None)?;
        for w in offs.windows(2) {
            let s = std::str::from_utf8(&bytes[w[0] as usize..w[1] as usize])
                .map_err(|e| Error::format(graph_part.path(), e.to_string()))?;
            let next = self.texts.len();
            if self.texts.intern(s)? as usize != next {
                return Err(Error::format(
                    graph_part.path(),
                    format!(
                        "text value {s:?} is recorded as new here but an earlier table added it"
                    ),
                ));
            }
        }
        self.num_rows += n as u64;
        self.graph_parts.push(graph_part);
        self.fk_refs.push(part.fk_refs);
        self.cat_strings.extend(part.categories_added);
        self.columns.extend(part.columns);
        let (count, mean, m2, min, max) = part.ts;
        self.ts_stats.merge(&RunningStats {
            count,
            mean,
            m2,
            min,
            max,
        });
        self.files.insert(part.table.file.clone(), part.digest);
        self.tables.push(part.table);
        Ok(true)
    }

    /// Add the next table in one call: [`begin_table`](Self::begin_table),
    /// [`add_column`](Self::add_column) per column,
    /// [`end_table`](Self::end_table). Same bytes as the streamed calls.
    pub fn add_table(&mut self, input: TableInput<'_>) -> Result<()> {
        let num_stored = input.columns.iter().filter(|c| c.stype.is_stored()).count();
        self.begin_table(TableSpec {
            name: input.name,
            num_rows: input.num_rows,
            primary_key: input.primary_key,
            time_column: input.time_column,
            fingerprint: input.fingerprint,
            num_stored,
        })?;
        for c in input.columns {
            self.add_column(c)?;
        }
        self.end_table(input.row_time, &input.foreign_keys)
    }

    /// Start the next table; its stored columns follow one at a time
    /// ([`add_column`](Self::add_column)), each encoded and written to
    /// `tables/<t>.bin` at once, so only one column is ever held.
    pub fn begin_table(&mut self, spec: TableSpec) -> Result<()> {
        if let Some(open) = &self.open {
            return Err(Error::Preprocess(format!(
                "table `{}`: begun while table `{}` is not ended",
                spec.name, open.spec.name
            )));
        }
        check_name("table", &spec.name)?;
        if self.table_index(&spec.name).is_some() {
            return Err(Error::Preprocess(format!(
                "table `{}` added twice",
                spec.name
            )));
        }
        let t = self.tables.len() as u32;
        let row_offset = self.num_rows;
        if row_offset + spec.num_rows as u64 > u32::MAX as u64 {
            return Err(Error::Preprocess(format!(
                "table `{}`: the database would exceed {} rows",
                spec.name,
                u32::MAX
            )));
        }
        if self.tables.len() >= u16::MAX as usize {
            return Err(Error::Preprocess(format!(
                "table `{}`: more than {} tables",
                spec.name,
                u16::MAX
            )));
        }
        let file = format!("tables/{t}.bin");
        let path = self.staging.join(&file);
        let writer = FileWriter::create(&path, FileKind::Table, 2 * spec.num_stored)?;
        self.open = Some(OpenTable {
            t,
            row_offset,
            file,
            writer,
            text_before: self.texts.len(),
            cats_before: self.cat_strings.len(),
            cols_before: self.columns.len(),
            stored: vec![],
            unstored: vec![],
            ts_table: RunningStats::default(),
            seen: std::collections::HashSet::new(),
            spec,
        });
        Ok(())
    }

    /// Add the next column of the open table (source order). An error
    /// discards the open table.
    pub fn add_column(&mut self, c: ColumnInput<'_>) -> Result<()> {
        let mut open = self
            .open
            .take()
            .ok_or_else(|| Error::Preprocess(format!("column `{}`: no table begun", c.name)))?;
        let r = self.add_column_to(&mut open, c);
        match r {
            Ok(()) => self.open = Some(open),
            Err(_) => self.discard(open),
        }
        r
    }

    /// Forget a table whose column failed: what it allocated is released,
    /// so the next table starts from the same indices.
    fn discard(&mut self, open: OpenTable) {
        self.columns.truncate(open.cols_before);
        self.cat_strings.truncate(open.cats_before);
        self.texts.truncate(open.text_before);
    }

    fn add_column_to(&mut self, open: &mut OpenTable, c: ColumnInput<'_>) -> Result<()> {
        let tname = &open.spec.name;
        check_name("column", &c.name)?;
        if !open.seen.insert(c.name.clone()) {
            return Err(Error::Preprocess(format!(
                "table `{tname}`: column `{}` appears twice",
                c.name
            )));
        }
        let what = format!("table `{tname}` column `{}`", c.name);
        let data_kind = match &c.data {
            ColumnData::Unstored => None,
            ColumnData::Numerical { .. } => Some(SemanticType::Numerical),
            ColumnData::Boolean { .. } => Some(SemanticType::Boolean),
            ColumnData::Timestamp { .. } => Some(SemanticType::Timestamp),
            ColumnData::Categorical { .. } => Some(SemanticType::Categorical),
            ColumnData::Text { .. } | ColumnData::TextIds { .. } => Some(SemanticType::Text),
        };
        if data_kind != c.stype.is_stored().then_some(c.stype) {
            return Err(Error::Preprocess(format!(
                "{what}: data does not match semantic type {}",
                c.stype.name()
            )));
        }
        if !c.stype.is_stored() {
            open.unstored.push(metadata_unstored(&c));
            return Ok(());
        }
        if open.stored.len() == open.spec.num_stored {
            return Err(Error::Preprocess(format!(
                "{what}: more stored columns than the {} declared at begin_table",
                open.spec.num_stored
            )));
        }
        let enc = self.scan(&what, open.spec.num_rows, &c.data)?;
        enc.encoding
            .write(&mut open.writer, open.spec.num_rows, &c.data)?;
        if let Some(ts) = &enc.ts {
            open.ts_table.merge(ts);
        }
        let categories = match c.data {
            ColumnData::Categorical { categories, .. } => categories,
            _ => vec![],
        };
        let slot = open.stored.len() as u32;
        let idx = self.new_column(
            open.t,
            &c.name,
            c.stype,
            &c.source_type,
            c.inferred,
            Some(slot),
            enc.stats.clone(),
            categories,
        );
        open.stored.push(idx);
        Ok(())
    }

    /// Finish the open table: its row times and foreign keys (parent row
    /// per row), then the restart record that marks it complete.
    pub fn end_table(
        &mut self,
        row_time: &[i64],
        foreign_keys: &[ForeignKeyInput<'_>],
    ) -> Result<()> {
        let open = self
            .open
            .take()
            .ok_or_else(|| Error::Preprocess("end_table: no table begun".into()))?;
        let OpenTable {
            t,
            row_offset,
            file,
            writer,
            text_before,
            cats_before,
            cols_before,
            stored,
            unstored,
            ts_table,
            spec,
            ..
        } = open;
        let n = spec.num_rows;
        if stored.len() != spec.num_stored {
            return Err(Error::Preprocess(format!(
                "table `{}`: {} stored columns added, {} declared at begin_table",
                spec.name,
                stored.len(),
                spec.num_stored
            )));
        }
        check_len(
            &format!("table `{}` row times", spec.name),
            row_time.len(),
            n,
        )?;
        let (len, sum) = writer.finish()?;
        let mut fk_meta = Vec::new();
        let mut fk_refs = Vec::new();
        for fk in foreign_keys {
            check_len(
                &format!("table `{}` foreign key `{}`", spec.name, fk.column),
                fk.parents.len(),
                n,
            )?;
            fk_meta.push(ForeignKeyMeta {
                column: fk.column.clone(),
                references: u32::MAX, // resolved in finish()
                num_edges: fk
                    .parents
                    .iter()
                    .filter(|&&p| parent_row(p).is_some())
                    .count() as u64,
                num_null: fk.num_null,
                num_dangling: fk.num_dangling,
            });
            fk_refs.push(fk.references.clone());
        }
        let table = TableMeta {
            idx: t,
            name: spec.name.clone(),
            file: file.clone(),
            row_offset,
            num_rows: n as u64,
            primary_key: spec.primary_key.clone(),
            time_column: spec.time_column.clone(),
            foreign_keys: fk_meta,
            columns: stored,
            unstored_columns: unstored,
        };
        // Restart record: graph inputs + new strings, then the JSON that marks
        // the table complete (written last).
        let part_bin = self.staging.join(format!("parts/{t}.bin"));
        let (offs, bytes) = self.texts.tail(text_before);
        let mut pw = FileWriter::create(&part_bin, FileKind::Graph, foreign_keys.len() + 3)?;
        pw.section(Section::of(row_time))?;
        // Each foreign key's parents as u32 (`u32::MAX` = none), converted a
        // chunk at a time: never a whole column's copy.
        let mut chunk: Vec<u32> = Vec::with_capacity(PART_CHUNK);
        for fk in foreign_keys {
            pw.begin_section()?;
            for part in fk.parents.chunks(PART_CHUNK) {
                chunk.clear();
                chunk.extend(part.iter().map(|&p| parent_row(p).unwrap_or(u32::MAX)));
                pw.append(Section::of(&chunk))?;
            }
        }
        // The new strings' offsets from 0, a chunk at a time.
        let base = offs[0];
        stream_values(&mut pw, offs.len(), |r, buf: &mut Vec<u64>| {
            buf.extend(offs[r].iter().map(|&o| o - base));
        })?;
        pw.section(Section(bytes))?;
        pw.finish()?;
        let graph_part = MappedFile::open(&part_bin, FileKind::Graph, Some(fk_refs.len() + 3))?;
        let part = TablePart {
            fingerprint: spec.fingerprint.clone(),
            table: table.clone(),
            fk_refs: fk_refs.clone(),
            columns: self.columns[cols_before..].to_vec(),
            categories_added: self.cat_strings[cats_before..].to_vec(),
            ts: (
                ts_table.count,
                ts_table.mean,
                ts_table.m2,
                ts_table.min,
                ts_table.max,
            ),
            digest: digest(len, sum),
        };
        let json_path = self.staging.join(format!("parts/{t}.json"));
        fs::write(&json_path, serde_json::to_vec(&part).expect("serialisable"))
            .map_err(io(&json_path))?;
        self.ts_stats.merge(&ts_table);
        self.num_rows += n as u64;
        self.graph_parts.push(graph_part);
        self.fk_refs.push(fk_refs);
        self.files.insert(file, digest(len, sum));
        self.tables.push(table);
        Ok(())
    }

    fn check_task_name(&self, name: &str) -> Result<()> {
        check_name("task", name)?;
        if self.tasks.iter().any(|k| k.name == name) {
            return Err(Error::Preprocess(format!("task `{name}` declared twice")));
        }
        Ok(())
    }

    /// A cell-masking task: every row of `table` whose `column` is not null is
    /// a seed; the target is that cell; the observation time is the row's time.
    pub fn add_cell_task(
        &mut self,
        name: &str,
        table: &str,
        column: &str,
        description: Option<String>,
    ) -> Result<()> {
        self.check_task_name(name)?;
        let t = self.table_index(table).ok_or_else(|| {
            Error::Preprocess(format!("task `{name}`: unknown anchor table `{table}`"))
        })?;
        let tm = self.tables[t].clone();
        let col = tm
            .columns
            .iter()
            .map(|&c| &self.columns[c as usize])
            .find(|c| c.name == column)
            .cloned()
            .ok_or_else(|| {
                Error::Preprocess(format!(
                    "task `{name}`: table `{table}` has no stored column `{column}`"
                ))
            })?;
        if !col.stype.is_target() {
            return Err(Error::Preprocess(format!(
                "task `{name}`: column `{table}.{column}` is {}, which no decoder head predicts (numerical, boolean, timestamp, categorical)",
                col.stype.name()
            )));
        }
        let f = MappedFile::open(&self.staging.join(&tm.file), FileKind::Table, None)?;
        let slot = col.slot.expect("stored column") as usize;
        let n = tm.num_rows as usize;
        let validity: &[u8] = f.section(2 * slot + 1, Some(n.div_ceil(8)))?;
        // The seeds are the rows with a value; each section is streamed a
        // chunk of seeds at a time (a pass over the validity bits per
        // section), so no per-seed array is held.
        let num_seeds = (0..n).filter(|&r| bit(validity, r)).count();
        if num_seeds == 0 {
            return Err(Error::Preprocess(format!(
                "task `{name}`: column `{table}.{column}` has no non-null values (zero seeds)"
            )));
        }
        let size = col.stype.value_size();
        let raw: &[u8] = f.section(2 * slot, Some(n * size))?;
        let row_time = self.table_row_time(t)?;
        let base = tm.row_offset as u32;
        let k = self.tasks.len();
        let file = format!("tasks/{k}.bin");
        let path = self.staging.join(&file);
        let mut w = FileWriter::create(&path, FileKind::Task, 4)?;
        let mut temporal = false;
        let seeds = || (0..n).filter(|&r| bit(validity, r));
        let mut anchors: Vec<u32> = Vec::with_capacity(PART_CHUNK);
        w.begin_section()?;
        for r in seeds() {
            anchors.push(base + r as u32);
            if anchors.len() == PART_CHUNK {
                w.append(Section::of(&anchors))?;
                anchors.clear();
            }
        }
        w.append(Section::of(&anchors))?;
        drop(anchors);
        let mut obs: Vec<i64> = Vec::with_capacity(PART_CHUNK);
        w.begin_section()?;
        for r in seeds() {
            let o = match row_time[r] {
                i64::MIN => i64::MAX,
                t => t,
            };
            temporal |= o != i64::MAX;
            obs.push(o);
            if obs.len() == PART_CHUNK {
                w.append(Section::of(&obs))?;
                obs.clear();
            }
        }
        w.append(Section::of(&obs))?;
        drop(obs);
        let mut values: Vec<u8> = Vec::with_capacity(PART_CHUNK * size);
        w.begin_section()?;
        for r in seeds() {
            values.extend_from_slice(&raw[r * size..(r + 1) * size]);
            if values.len() >= PART_CHUNK * size {
                w.append(Section(&values))?;
                values.clear();
            }
        }
        w.append(Section(&values))?;
        drop(values);
        w.section(Section(&pack_bits(std::iter::repeat_n(true, num_seeds))))?;
        let (len, sum) = w.finish()?;
        let meta = TaskMeta {
            idx: k as u32,
            name: name.to_string(),
            kind: "cell".into(),
            file: file.clone(),
            anchor_table: t as u32,
            target_column: col.idx,
            target_stype: col.stype,
            num_seeds: num_seeds as u64,
            num_null_targets: 0,
            temporal,
            query: None,
            description,
            stored_splits: false,
        };
        self.files.insert(file, digest(len, sum));
        self.tasks.push(meta);
        Ok(())
    }

    /// A task whose targets are supplied (SQL query or imported labels).
    pub fn add_task(&mut self, input: TaskInput<'_>) -> Result<()> {
        self.check_task_name(&input.name)?;
        let name = input.name.clone();
        let t = self.table_index(&input.anchor_table).ok_or_else(|| {
            Error::Preprocess(format!(
                "task `{name}`: unknown anchor table `{}`",
                input.anchor_table
            ))
        })?;
        let tm = self.tables[t].clone();
        let n = input.anchor_rows.len();
        if n == 0 {
            return Err(Error::Preprocess(format!(
                "task `{name}` has zero rows (no seeds)"
            )));
        }
        check_len(
            &format!("task `{name}` observation times"),
            input.obs_time.len(),
            n,
        )?;
        if let Some((i, &r)) = input
            .anchor_rows
            .iter()
            .enumerate()
            .find(|(_, &r)| r as u64 >= tm.num_rows)
        {
            return Err(Error::Preprocess(format!(
                "task `{name}`: row {i} anchors row {r} of `{}`, which has {} rows",
                tm.name, tm.num_rows
            )));
        }
        if let Some(codes) = input.splits {
            check_len(&format!("task `{name}` stored splits"), codes.len(), n)?;
            if let Some((i, &c)) = codes
                .iter()
                .enumerate()
                .find(|(_, &c)| Split::from_code(c).is_none())
            {
                return Err(Error::Preprocess(format!(
                    "task `{name}`: row {i} has split code {c}; expected 0 (train), 1 (val) or 2 (test)"
                )));
            }
        }
        let TaskTarget::Values { stype, data } = input.target;
        if !stype.is_target() {
            return Err(Error::Preprocess(format!(
                "task `{name}`: target semantic type {} has no decoder head",
                stype.name()
            )));
        }
        let enc = self.scan(&format!("task `{name}` target"), n, &data)?;
        let categories = match &data {
            ColumnData::Categorical { categories, .. } => categories.clone(),
            _ => vec![],
        };
        let num_null = enc.stats.null_count;
        let col = self.new_column(
            t as u32,
            &name,
            stype,
            "task target",
            false,
            None,
            enc.stats.clone(),
            categories,
        );
        let k = self.tasks.len();
        let meta = TaskMeta {
            idx: k as u32,
            name,
            kind: input.kind,
            file: format!("tasks/{k}.bin"),
            anchor_table: t as u32,
            target_column: col,
            target_stype: stype,
            num_seeds: n as u64,
            num_null_targets: num_null,
            temporal: input.obs_time.iter().any(|&o| o != i64::MAX),
            query: input.query,
            description: input.description,
            stored_splits: input.splits.is_some(),
        };
        // Every section is written a chunk at a time: the task's rows
        // stay in the caller's (spilled) arrays.
        let path = self.staging.join(&meta.file);
        let num_sections = 4 + input.splits.is_some() as usize;
        let mut w = FileWriter::create(&path, FileKind::Task, num_sections)?;
        let base = tm.row_offset as u32;
        stream_values(&mut w, n, |r, buf: &mut Vec<u32>| {
            buf.extend(input.anchor_rows[r].iter().map(|&a| a + base));
        })?;
        w.section(Section::of(input.obs_time))?;
        enc.encoding.write(&mut w, n, &data)?;
        if let Some(codes) = input.splits {
            w.section(Section(codes))?;
        }
        let (len, sum) = w.finish()?;
        self.files.insert(meta.file.clone(), digest(len, sum));
        self.tasks.push(meta);
        Ok(())
    }

    /// Strings to embed, in table order: column names, category labels, text values.
    pub fn column_texts(&self) -> Vec<String> {
        self.columns
            .iter()
            .map(|c| format!("{} of {}", c.name, self.tables[c.table as usize].name))
            .collect()
    }
    /// Category names in embedding order.
    pub fn category_texts(&self) -> &[String] {
        &self.cat_strings
    }
    /// Number of distinct text values.
    pub fn num_text_values(&self) -> usize {
        self.texts.len()
    }

    /// Intern a chunk's dictionary of text values (Arrow `large_string`
    /// buffers, first appearance first) for the open table's next column:
    /// their global ids, new values numbered in order. A text column is
    /// streamed this way and then added as [`ColumnData::TextIds`]; a table
    /// discarded later forgets the values it interned.
    pub fn intern_texts(&mut self, offsets: &[i64], bytes: &[u8]) -> Result<Vec<u32>> {
        let Some(open) = &self.open else {
            return Err(Error::Preprocess("intern_texts: no table begun".into()));
        };
        let what = format!("table `{}` text values", open.spec.name);
        intern_dictionary(&mut self.texts, &what, offsets, bytes)
    }
    /// Distinct text values `start..stop` (clamped), in embedding order.
    pub fn text_values(&self, start: usize, stop: usize) -> impl Iterator<Item = &str> {
        let stop = stop.min(self.texts.len());
        (start.min(stop)..stop).map(|i| self.texts.get(i))
    }

    /// Write an embeddings file of the strings `offs`/`bytes` (end offsets
    /// with a leading 0, UTF-8) and their vectors `emb`.
    fn write_embeddings(
        &mut self,
        file: &str,
        emb: &[f16],
        offs: &[u64],
        bytes: &[u8],
    ) -> Result<()> {
        let d = self.embedder.dim as usize;
        let n = offs.len() - 1;
        if emb.len() != n * d {
            return Err(Error::invalid(
                file,
                format!(
                    "{} values, expected {n} strings × dim {d} = {}",
                    emb.len(),
                    n * d
                ),
            ));
        }
        let path = self.staging.join(file);
        let mut w = FileWriter::create(&path, FileKind::Embeddings, 3)?;
        w.section(Section::of(emb))?;
        w.section(Section::of(offs))?;
        w.section(Section(bytes))?;
        let (len, sum) = w.finish()?;
        self.files.insert(file.to_string(), digest(len, sum));
        Ok(())
    }

    /// [`Self::write_embeddings`] of a list of strings.
    fn write_string_embeddings(&mut self, file: &str, emb: &[f16], texts: &[String]) -> Result<()> {
        let mut offs = Vec::with_capacity(texts.len() + 1);
        let mut bytes = Vec::new();
        offs.push(0u64);
        for s in texts {
            bytes.extend_from_slice(s.as_bytes());
            offs.push(bytes.len() as u64);
        }
        self.write_embeddings(file, emb, &offs, &bytes)
    }

    /// Build the graph, write embeddings and metadata, and publish the
    /// directory at `out` (replacing it only if `overwrite`).
    pub fn finish(
        mut self,
        column_emb: &[f16],
        categorical_emb: &[f16],
        text_emb: &[f16],
        overwrite: bool,
    ) -> Result<Metadata> {
        if let Some(open) = &self.open {
            return Err(Error::Preprocess(format!(
                "finish: table `{}` was begun but not ended",
                open.spec.name
            )));
        }
        if self.tasks.is_empty() {
            return Err(Error::Preprocess(
                "the database has no tasks: declare tasks or keep a column that can be masked"
                    .into(),
            ));
        }
        // Resolve foreign-key targets now that every table is known.
        let offsets: Vec<u64> = self.tables.iter().map(|t| t.row_offset).collect();
        let sizes: Vec<u64> = self.tables.iter().map(|t| t.num_rows).collect();
        for t in 0..self.tables.len() {
            for j in 0..self.fk_refs[t].len() {
                let target = &self.fk_refs[t][j];
                let r = self.table_index(target).ok_or_else(|| {
                    Error::Preprocess(format!(
                        "table `{}` foreign key `{}` references unknown table `{target}`",
                        self.tables[t].name, self.tables[t].foreign_keys[j].column
                    ))
                })?;
                if let Some(&bad) = self
                    .table_parents(t, j)?
                    .iter()
                    .find(|&&p| p != u32::MAX && p as u64 >= sizes[r])
                {
                    return Err(Error::Preprocess(format!(
                        "table `{}` foreign key `{}` points at row {bad} of `{target}`, which has {} rows",
                        self.tables[t].name, self.tables[t].foreign_keys[j].column, sizes[r]
                    )));
                }
                self.tables[t].foreign_keys[j].references = r as u32;
            }
        }
        let n = self.num_rows as usize;
        let path = self.staging.join("graph.bin");
        let mut w = FileWriter::create(&path, FileKind::Graph, 7)?;
        // row_table, streamed table by table.
        w.begin_section()?;
        for t in &self.tables {
            let run = vec![t.idx as u16; (t.num_rows as usize).min(1 << 16)];
            let mut left = t.num_rows as usize;
            while left > 0 {
                let k = left.min(run.len());
                w.append(Section::of(&run[..k]))?;
                left -= k;
            }
        }
        // Every row's time, concatenated into a spill file (read at random
        // while sorting children), and streamed out.
        let mut row_time = SpillArray::<i64>::zeroed(&self.staging.join("row_time.spill"), n)?;
        w.begin_section()?;
        for t in 0..self.tables.len() {
            let times = self.table_row_time(t)?;
            let at = self.tables[t].row_offset as usize;
            row_time[at..at + times.len()].copy_from_slice(times);
            w.append(Section::of(times))?;
        }
        // Global row → (table, local row), walking the tables in order.
        let bounds: Vec<u64> = self
            .tables
            .iter()
            .map(|t| t.row_offset + t.num_rows)
            .collect();
        let fk_parents = (0..self.tables.len())
            .map(|t| {
                (0..self.tables[t].foreign_keys.len())
                    .map(|j| self.table_parents(t, j))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let tables = &self.tables;
        let parents = |r: usize, out: &mut Vec<u32>| {
            let t = bounds.partition_point(|&b| b <= r as u64);
            let local = r - offsets[t] as usize;
            for (j, fk) in tables[t].foreign_keys.iter().enumerate() {
                let p = fk_parents[t][j][local];
                if p != u32::MAX {
                    out.push(p + offsets[fk.references as usize] as u32);
                }
            }
        };
        let num_edges = write_forward(&mut w, n, parents)?;
        let rev = build_reverse(&self.staging, n, &row_time, parents)?;
        write_reverse(&mut w, &rev, &row_time)?;
        drop(rev);
        drop(row_time);
        let (len, sum) = w.finish()?;
        self.files.insert("graph.bin".into(), digest(len, sum));
        let col_texts = self.column_texts();
        self.write_string_embeddings("column_embeddings.bin", column_emb, &col_texts)?;
        let cat_texts = std::mem::take(&mut self.cat_strings);
        self.write_string_embeddings("categorical_embeddings.bin", categorical_emb, &cat_texts)?;
        let text_values = std::mem::replace(&mut self.texts, TextTable::in_memory());
        let (offs, bytes) = text_values.sections();
        self.write_embeddings("text_embeddings.bin", text_emb, offs, bytes)?;
        let mut meta = Metadata {
            format_version: FORMAT_VERSION,
            content_hash: String::new(),
            producer: format!("headwater {}", env!("CARGO_PKG_VERSION")),
            source: self.source.clone(),
            embedder: self.embedder.clone(),
            num_rows: n as u64,
            num_edges,
            num_text_embeddings: text_values.len() as u64,
            num_categorical_embeddings: cat_texts.len() as u64,
            timestamp_stats: TimestampStats {
                mean_us: self.ts_stats.mean,
                std_us: self.ts_stats.scale(),
                count: self.ts_stats.count,
            },
            tables: std::mem::take(&mut self.tables),
            columns: std::mem::take(&mut self.columns),
            tasks: std::mem::take(&mut self.tasks),
            files: std::mem::take(&mut self.files),
        };
        meta.content_hash = meta.compute_content_hash();
        let meta_path = self.staging.join("metadata.json");
        fs::write(
            &meta_path,
            serde_json::to_vec_pretty(&meta).expect("serialisable"),
        )
        .map_err(io(&meta_path))?;
        drop(text_values);
        for d in ["parts", "scratch"] {
            let p = self.staging.join(d);
            fs::remove_dir_all(&p).map_err(io(&p))?;
        }
        if self.out.exists() {
            if !overwrite {
                return Err(Error::invalid(
                    "out_dir",
                    format!(
                        "{} already exists (pass overwrite to replace it)",
                        self.out.display()
                    ),
                ));
            }
            let old = self.out.with_file_name(format!(
                "{}.old",
                self.out.file_name().unwrap_or_default().to_string_lossy()
            ));
            let _ = fs::remove_dir_all(&old);
            fs::rename(&self.out, &old).map_err(io(&self.out))?;
            fs::rename(&self.staging, &self.out).map_err(io(&self.out))?;
            fs::remove_dir_all(&old).map_err(io(&old))?;
        } else {
            fs::rename(&self.staging, &self.out).map_err(io(&self.out))?;
        }
        // Make sure a published database opens and every payload checksum
        // holds: the write-time verification (open alone hashes no payload).
        crate::format::Database::open_with(&self.out, crate::format::Verify::Full)?;
        Ok(meta)
    }
}

/// Metadata record of a column that is not stored.
fn metadata_unstored(c: &ColumnInput<'_>) -> crate::format::UnstoredColumn {
    crate::format::UnstoredColumn {
        name: c.name.clone(),
        stype: c.stype,
        source_type: c.source_type.clone(),
        inferred: c.inferred,
    }
}

/// Intern the strings of an Arrow-style dictionary (`offsets` into `bytes`)
/// into `texts`; their global ids, in dictionary order.
fn intern_dictionary(
    texts: &mut TextTable,
    what: &str,
    offsets: &[i64],
    bytes: &[u8],
) -> Result<Vec<u32>> {
    let dict_len = offsets.len().saturating_sub(1);
    let mut global = Vec::with_capacity(dict_len);
    for j in 0..dict_len {
        let (a, b) = (offsets[j], offsets[j + 1]);
        if a < 0 || b < a || b as usize > bytes.len() {
            return Err(Error::Preprocess(format!(
                "{what}: dictionary entry {j} spans {a}..{b}, outside {} bytes",
                bytes.len()
            )));
        }
        let s = std::str::from_utf8(&bytes[a as usize..b as usize]).map_err(|e| {
            Error::Preprocess(format!("{what}: dictionary entry {j} is not UTF-8: {e}"))
        })?;
        global.push(texts.intern(s)?);
    }
    Ok(global)
}
