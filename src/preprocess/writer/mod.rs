//! [`DatabaseWriter`]: the resumable writer of one database directory.
//!
//! One type over several files, each owning what it writes:
//! - `input.rs`: what the front end hands in (columns, foreign keys,
//!   tables, tasks), borrowed, never copied;
//! - `columns.rs`: a column's two passes: the scan (lengths, values,
//!   statistics, the encoding, text interning) and the streamed write of its
//!   values and validity sections, shared by table columns and task targets;
//! - `tables.rs`: `tables/<t>.bin`, fed one column at a time
//!   (`begin_table` / `add_column` / `end_table`), and each finished
//!   table's restart record in `parts/`;
//! - `resume.rs`: reusing the staged tables of an interrupted run;
//! - `tasks.rs`: `tasks/<k>.bin`, for cell tasks and supplied targets;
//! - `embeddings.rs`: the strings to embed and the `*_embeddings.bin` files;
//! - this file: the staging directory, the state every part shares, and
//!   [`DatabaseWriter::finish`]: `graph.bin`, `metadata.json` and the
//!   atomic publish.
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

use super::graph::{build_reverse, write_forward, write_reverse};
use super::spill::SpillArray;
use super::stats::RunningStats;
use super::texts::TextTable;
use crate::error::{Error, Result};
use crate::format::{
    ColumnMeta, EmbedderMeta, FileDigest, FileKind, FileWriter, MappedFile, Metadata, Section,
    TableMeta, TaskMeta, TimestampStats, FORMAT_VERSION,
};

mod columns;
mod embeddings;
mod input;
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
