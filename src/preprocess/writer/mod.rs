//! [`DatabaseWriter`]: the resumable writer of one database directory.
//!
//! One type over several files, each owning what it writes:
//! - `input.rs`: what the front end hands in (columns, foreign keys,
//!   tables, tasks), borrowed, never copied;
//! - `columns.rs`: a column's two passes: the scan (lengths, values,
//!   statistics, the encoding, text interning) and the streamed write of its
//!   values and validity sections, shared by table columns and task targets;
//! - `past.rs`: which rows feed the statistics (the validation cutoff, a
//!   task's val/test seeds left out) and the
//!   [`StatsRule`](crate::format::StatsRule) that records it;
//! - `tables.rs`: `tables/<t>.bin`, fed one column at a time
//!   (`begin_table` / `add_column` / `end_table`), and each finished
//!   table's restart record in `parts/`;
//! - `resume.rs`: reusing the staged tables of an interrupted run;
//! - `tasks.rs`: `tasks/<k>.bin`, for cell tasks and supplied targets;
//! - `embeddings.rs`: the strings to embed and the `*_embeddings.bin` files;
//! - `graph_file.rs`: `graph.bin`, once every table is in;
//! - this file: the staging directory, the state every part shares, and
//!   [`DatabaseWriter::finish`]: the files above in order, `metadata.json`
//!   and the atomic publish.
//!
//! Invariants: everything is written into `<out>.partial` and renamed into
//! place only by `finish`, after which the directory opens with every
//! payload checksum verified. Global indices (row, column, category, text)
//! are allocated in table order, and a table whose column fails releases
//! what it allocated, so a restarted run can reuse the longest prefix of
//! finished tables. Never: hold a whole column, task or the graph in private
//! memory (each is streamed a chunk of rows at a time or spilled to a file
//! map), or write outside the staging directory before the publish.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use half::f16;

use super::stats::RunningStats;
use crate::error::{Error, Result};
use crate::format::{
    ColumnMeta, EmbedderMeta, FileDigest, MappedFile, Metadata, TableMeta, TaskMeta,
    TimestampStats, FORMAT_VERSION,
};
use crate::spill::TextTable;

mod columns;
mod embeddings;
mod graph_file;
mod input;
mod past;
mod resume;
mod tables;
mod tasks;

pub use input::{
    ColumnData, ColumnInput, ForeignKeyInput, TableInput, TableSpec, TaskInput, TaskTarget,
};
use tables::OpenTable;

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
    /// Rows dated after this (µs) feed no statistic (`set_stats_cutoff`).
    stats_cutoff: Option<i64>,
    resumed: usize,
    /// The table between `begin_table` and `end_table`.
    open: Option<OpenTable>,
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
            stats_cutoff: None,
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
        self.resolve_foreign_keys()?;
        let (num_edges, num_reverse) = self.write_graph()?;
        let (num_text, num_categorical) =
            self.write_all_embeddings(column_emb, categorical_emb, text_emb)?;
        let mut meta = Metadata {
            format_version: FORMAT_VERSION,
            content_hash: String::new(),
            producer: format!("headwater {}", env!("CARGO_PKG_VERSION")),
            source: self.source.clone(),
            embedder: self.embedder.clone(),
            num_rows: self.num_rows,
            num_edges,
            num_reverse_edges: (num_reverse != num_edges).then_some(num_reverse),
            num_text_embeddings: num_text,
            num_categorical_embeddings: num_categorical,
            timestamp_stats: TimestampStats {
                mean_us: self.ts_stats.mean,
                std_us: self.ts_stats.scale(),
                count: self.ts_stats.count,
            },
            stats_rule: Some(self.stats_rule()),
            tables: std::mem::take(&mut self.tables),
            columns: std::mem::take(&mut self.columns),
            tasks: std::mem::take(&mut self.tasks),
            files: std::mem::take(&mut self.files),
        };
        meta.content_hash = meta.compute_content_hash();
        self.publish(&meta, overwrite)?;
        Ok(meta)
    }

    /// Write `metadata.json`, drop the scratch files and rename the staging
    /// directory to `out` (an existing one only if `overwrite`), then open
    /// it with every payload checksum verified.
    fn publish(self, meta: &Metadata, overwrite: bool) -> Result<()> {
        let meta_path = self.staging.join("metadata.json");
        fs::write(
            &meta_path,
            serde_json::to_vec_pretty(meta).expect("serialisable"),
        )
        .map_err(io(&meta_path))?;
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
        Ok(())
    }
}
