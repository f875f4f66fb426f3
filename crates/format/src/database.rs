//! Opening a preprocessed database: map every file, validate once, and hand
//! out zero-copy views.
//!
//! Invariants: a [`Database`] that exists has validated every file header
//! (and, format 2, hashed every block table),
//! checked every section length against `metadata.json`, and recomputed the
//! content hash — all in time independent of the database size (no payload
//! byte is read at open: a task's stored split codes are checked where they
//! are read, see [`TaskView::split_code`]). Payload checksums and the O(rows) content checks
//! run only with `verify="full"` (and in `headwater verify`). So the views
//! check what they read ([`super::views`]; a corrupt block is caught before
//! a batch built from it is delivered) and must also be safe on garbage
//! payloads of format-1 files: [`GraphView::parents`] and
//! [`GraphView::children`] return an empty slice for out-of-range CSR
//! offsets, and [`GraphView::table_of`] rejects a row id whose `row_table`
//! entry does not match the table ranges from the metadata; the sampler
//! uses only rows that pass it. Views are plain slices into the read-only
//! maps; nothing here copies column or graph data.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;

use super::blocks::Integrity;
use super::header::{FileKind, MappedFile};
use super::metadata::{Metadata, SemanticType};
use super::split::Split;
use super::views::{
    CellCheck, ColumnValues, ColumnView, EmbeddingRows, GraphView, TableView, TaskView,
};
use headwater_common::error::{Error, Result};

/// An open, validated, memory-mapped database directory.
pub struct Database {
    dir: PathBuf,
    meta: Metadata,
    integrity: Arc<Integrity>,
    table_rows: Vec<(u32, u32)>,
    graph: MappedFile,
    tables: Vec<MappedFile>,
    tasks: Vec<MappedFile>,
    column_emb: MappedFile,
    categorical_emb: MappedFile,
    text_emb: MappedFile,
}

fn values(
    f: &MappedFile,
    section: usize,
    stype: SemanticType,
    n: usize,
) -> Result<ColumnValues<'_>> {
    Ok(match stype {
        SemanticType::Numerical => ColumnValues::Numerical(f.section(section, Some(n))?),
        SemanticType::Boolean => ColumnValues::Boolean(f.section(section, Some(n))?),
        SemanticType::Timestamp => ColumnValues::Timestamp(f.section(section, Some(n))?),
        SemanticType::Categorical => ColumnValues::Categorical(f.section(section, Some(n))?),
        SemanticType::Text => ColumnValues::Text(f.section(section, Some(n))?),
        other => {
            return Err(Error::format(
                f.path(),
                format!(
                    "section {section}: semantic type {} is never stored",
                    other.name()
                ),
            ))
        }
    })
}

impl Database {
    /// Open and validate the database in `dir` in time independent of its
    /// size (`Verify::Header`; `verify.rs` adds the other levels).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_headers(dir.as_ref(), false)
    }

    /// Bring every mapped file into the page cache as `mode` says
    /// ([`PageCache`]); `Lazy` does nothing.
    pub fn warm_page_cache(&self, mode: super::PageCache) -> Result<()> {
        for f in self.files() {
            super::page_cache::apply(f.map(), f.path(), mode)?;
        }
        Ok(())
    }

    /// Every mapped file, graph first.
    pub(super) fn files(&self) -> impl Iterator<Item = &MappedFile> {
        std::iter::once(&self.graph)
            .chain(&self.tables)
            .chain(&self.tasks)
            .chain([&self.column_emb, &self.categorical_emb, &self.text_emb])
    }

    /// Read `metadata.json`, then map and check every file it lists (with
    /// `huge_pages`, each map advised huge pages before its header is read)
    /// and every section's length: O(metadata).
    pub(super) fn open_headers(dir: &Path, huge_pages: bool) -> Result<Self> {
        let dir = dir.to_path_buf();
        let (meta_path, meta) = Metadata::read(&dir)?;
        let integrity = Arc::new(Integrity::default());
        let open = |rel: &str, kind: FileKind, n: Option<usize>| -> Result<MappedFile> {
            let path = dir.join(rel);
            let mut f = MappedFile::open_advised(&path, kind, n, huge_pages)?;
            f.share_integrity(integrity.clone());
            let digest = meta.files.get(rel).ok_or_else(|| {
                Error::format(&meta_path, format!("no digest recorded for {rel}"))
            })?;
            let sum = format!("{:016x}", f.payload_checksum());
            if digest.bytes != f.len_bytes() || digest.checksum != sum {
                return Err(Error::format(
                    &path,
                    format!(
                        "does not belong to this snapshot: {} bytes / checksum {sum}, metadata.json records {} bytes / {}",
                        f.len_bytes(),
                        digest.bytes,
                        digest.checksum
                    ),
                ));
            }
            Ok(f)
        };
        let graph = open("graph.bin", FileKind::Graph, Some(7))?;
        let mut tables = Vec::with_capacity(meta.tables.len());
        for t in &meta.tables {
            let expected = format!("tables/{}.bin", t.idx);
            if t.file != expected {
                return Err(Error::format(
                    &meta_path,
                    format!(
                        "table `{}` names file {:?}, expected {expected:?}",
                        t.name, t.file
                    ),
                ));
            }
            tables.push(open(&t.file, FileKind::Table, Some(2 * t.columns.len()))?);
        }
        let mut tasks = Vec::with_capacity(meta.tasks.len());
        for k in &meta.tasks {
            let expected = format!("tasks/{}.bin", k.idx);
            if k.file != expected {
                return Err(Error::format(
                    &meta_path,
                    format!(
                        "task `{}` names file {:?}, expected {expected:?}",
                        k.name, k.file
                    ),
                ));
            }
            let sections = if k.stored_splits { 5 } else { 4 };
            tasks.push(open(&k.file, FileKind::Task, Some(sections))?);
        }
        let column_emb = open("column_embeddings.bin", FileKind::Embeddings, Some(3))?;
        let categorical_emb = open("categorical_embeddings.bin", FileKind::Embeddings, Some(3))?;
        let text_emb = open("text_embeddings.bin", FileKind::Embeddings, Some(3))?;
        let table_rows = table_ranges(&meta, &meta_path)?;
        let db = Database {
            dir,
            meta,
            integrity,
            table_rows,
            graph,
            tables,
            tasks,
            column_emb,
            categorical_emb,
            text_emb,
        };
        db.validate_shapes()?;
        Ok(db)
    }

    /// Check every section's length against the metadata, once, so later
    /// views cannot fail. O(metadata): reads no payload byte.
    fn validate_shapes(&self) -> Result<()> {
        let m = &self.meta;
        let n = m.num_rows as usize;
        let e = m.num_edges as usize;
        let rev = m.num_reverse_edges.unwrap_or(m.num_edges) as usize;
        let g = &self.graph;
        g.section::<u16>(0, Some(n))?;
        g.section::<i64>(1, Some(n))?;
        for (base, edges) in [(2usize, e), (4, rev)] {
            g.section::<u64>(base, Some(n + 1))?;
            g.section::<u32>(base + 1, Some(edges))?;
        }
        g.section::<i64>(6, Some(rev))?;
        for t in &m.tables {
            self.table(t.idx as usize)?;
        }
        for k in 0..m.tasks.len() {
            self.task_unchecked(k)?;
        }
        let d = m.embedder.dim as usize;
        for (f, count) in [
            (&self.column_emb, m.columns.len()),
            (&self.categorical_emb, m.num_categorical_embeddings as usize),
            (&self.text_emb, m.num_text_embeddings as usize),
        ] {
            f.section::<f16>(0, Some(count * d))?;
            f.section::<u64>(1, Some(count + 1))?;
        }
        Ok(())
    }

    /// The path of task `k`'s file.
    pub fn task_path(&self, k: usize) -> Option<&Path> {
        self.tasks.get(k).map(MappedFile::path)
    }

    /// The graph file.
    pub(super) fn graph_file(&self) -> &MappedFile {
        &self.graph
    }

    /// The database directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The parsed `metadata.json`.
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }
    /// Hash of the metadata (identifies the snapshot).
    pub fn content_hash(&self) -> &str {
        &self.meta.content_hash
    }

    /// Zero-copy views of the graph sections.
    pub fn graph(&self) -> GraphView<'_> {
        let g = &self.graph;
        // Shapes were validated at open.
        GraphView {
            row_table: g.section(0, None).expect("validated"),
            row_time: g.section(1, None).expect("validated"),
            fwd_offsets: g.section(2, None).expect("validated"),
            fwd_targets: g.section(3, None).expect("validated"),
            rev_offsets: g.section(4, None).expect("validated"),
            rev_targets: g.section(5, None).expect("validated"),
            rev_times: g.section(6, None).expect("validated"),
            table_rows: &self.table_rows,
            file: (!g.all_verified()).then_some(g),
        }
    }

    /// What the reads of this database found (see [`super::blocks`]).
    pub fn integrity(&self) -> &Integrity {
        &self.integrity
    }

    /// The same record, to share with a file derived from the database
    /// (the walk graph), whose corrupt blocks then fail a batch alike.
    pub fn shared_integrity(&self) -> &Arc<Integrity> {
        &self.integrity
    }

    /// Per block of the file `rel` (a path as `metadata.json` names it),
    /// whether a read has checked it — for tests and diagnostics.
    pub fn verified_blocks(&self, rel: &str) -> Option<Vec<bool>> {
        let path = self.dir.join(rel);
        self.files()
            .find(|f| f.path() == path)
            .map(MappedFile::verified_blocks)
    }

    /// View of table `t`.
    pub fn table(&self, t: usize) -> Result<TableView<'_>> {
        let tm = self.meta.tables.get(t).ok_or_else(|| {
            Error::invalid(
                "table",
                format!(
                    "{t} out of range (database has {} tables)",
                    self.meta.tables.len()
                ),
            )
        })?;
        let f = &self.tables[t];
        let n = tm.num_rows as usize;
        let mut columns = Vec::with_capacity(tm.columns.len());
        for (j, &c) in tm.columns.iter().enumerate() {
            let cm = &self.meta.columns[c as usize];
            if cm.slot != Some(j as u32) {
                return Err(Error::format(
                    f.path(),
                    format!("column `{}` slot {:?} expected {j}", cm.name, cm.slot),
                ));
            }
            let values = values(f, 2 * j, cm.stype, n)?;
            // A file read whole already needs no checks (see `all_verified`).
            let (values_at, validity_at) = if f.all_verified() {
                (None, None)
            } else {
                (f.section_offset(2 * j), f.section_offset(2 * j + 1))
            };
            columns.push(ColumnView {
                column_idx: c,
                values,
                validity: f.section(2 * j + 1, Some(n.div_ceil(8)))?,
                all_valid: cm.stats.null_count == 0,
                file: values_at
                    .zip(validity_at)
                    .map(|(values_at, validity_at)| CellCheck {
                        file: f,
                        values_at,
                        validity_at,
                        size: values.elem_size(),
                    }),
            });
        }
        Ok(TableView {
            row_offset: tm.row_offset as u32,
            num_rows: n as u32,
            columns,
        })
    }

    /// View of task `k`, every block of its file checked (for a reader of
    /// whole sections: an evaluation pass's list, a forecast task's item
    /// index). The sampler's draws read through [`task_lazy`](Self::task_lazy).
    ///
    /// # Errors
    /// `k` out of range, or a corrupt block (in this file or one read
    /// before), naming its file and block.
    pub fn task(&self, k: usize) -> Result<TaskView<'_>> {
        let view = self.task_unchecked(k)?;
        Self::check_whole(&self.tasks[k])?;
        Ok(view)
    }

    /// View of task `k` whose reads are checked as they are made: nothing
    /// is hashed here, and the accessors of [`TaskView`] (`anchor_row`,
    /// `check_seed`, `checked_anchor_rows`, `split_code`) check the blocks
    /// of what they read, so a draw reads (and hashes) only the blocks of
    /// the seeds it uses. A corrupt block is in the database's record
    /// ([`integrity`](Self::integrity)), which fails the batch read from it.
    ///
    /// # Errors
    /// `k` out of range.
    pub fn task_lazy(&self, k: usize) -> Result<TaskView<'_>> {
        let mut view = self.task_unchecked(k)?;
        let f = &self.tasks[k];
        view.file = (!f.all_verified()).then_some(f);
        Ok(view)
    }

    /// The stored split codes of task `k` (`None`: the hash rule splits
    /// it), every block of them checked and every code a split: what a
    /// seed list of a task that keeps its source's splits is built from.
    ///
    /// # Errors
    /// `k` out of range, a corrupt block, or a code that names no split
    /// (naming the task file, the seed and the code).
    pub fn task_split_codes(&self, k: usize) -> Result<Option<&[u8]>> {
        let Some(codes) = self.task_unchecked(k)?.splits else {
            return Ok(None);
        };
        self.tasks[k].check_section(4)?;
        if let Some((i, &c)) = codes
            .iter()
            .enumerate()
            .find(|(_, &c)| Split::from_code(c).is_none())
        {
            return Err(Error::format(
                self.tasks[k].path(),
                format!(
                    "task `{}`: seed {i} has stored split code {c}; expected 0 (train), 1 (val) or 2 (test)",
                    self.meta.tasks[k].name
                ),
            ));
        }
        Ok(Some(codes))
    }

    /// Check every task file whole (for a caller that reads them whole;
    /// the sampler no longer does at open: its draws check what they read).
    ///
    /// # Errors
    /// The first corrupt block, naming its file and block.
    pub fn check_tasks(&self) -> Result<()> {
        self.tasks.iter().try_for_each(Self::check_whole)
    }

    /// Check every data section of `f`.
    fn check_whole(f: &MappedFile) -> Result<()> {
        (0..f.num_sections()).try_for_each(|i| f.check_section(i))
    }

    /// View of task `k`, unchecked (the O(metadata) open's shape checks).
    pub(super) fn task_unchecked(&self, k: usize) -> Result<TaskView<'_>> {
        let km = self.meta.tasks.get(k).ok_or_else(|| {
            Error::invalid(
                "task",
                format!(
                    "{k} out of range (database has {} tasks)",
                    self.meta.tasks.len()
                ),
            )
        })?;
        let f = &self.tasks[k];
        let n = km.num_seeds as usize;
        Ok(TaskView {
            anchor_rows: f.section(0, Some(n))?,
            obs_times: f.section(1, Some(n))?,
            targets: values(f, 2, km.target_stype, n)?,
            target_validity: f.section(3, Some(n.div_ceil(8)))?,
            splits: if km.stored_splits {
                Some(f.section(4, Some(n))?)
            } else {
                None
            },
            file: None,
        })
    }

    /// Section 0 of embedding file `f`, every block checked (these
    /// matrices are handed out whole).
    fn embeddings(f: &MappedFile) -> Result<&[f16]> {
        f.check_section(0)?;
        f.section(0, None)
    }

    /// Column-name embeddings `[C, D]`, row-major.
    pub fn column_embeddings(&self) -> Result<&[f16]> {
        Self::embeddings(&self.column_emb)
    }
    /// Category embeddings `[Vc, D]`.
    pub fn categorical_embeddings(&self) -> Result<&[f16]> {
        Self::embeddings(&self.categorical_emb)
    }
    /// Text-value embeddings `[Vt, D]`.
    pub fn text_embeddings(&self) -> Result<&[f16]> {
        Self::embeddings(&self.text_emb)
    }
    /// Text-value embeddings `[Vt, D]` as rows checked one by one as a
    /// batch collates them (the matrix can be large).
    pub fn text_embedding_rows(&self) -> Result<EmbeddingRows<'_>> {
        Ok(EmbeddingRows {
            data: self.text_emb.section(0, None)?,
            dim: self.meta.embedder.dim as usize,
            file: (!self.text_emb.all_verified()).then_some(&self.text_emb),
        })
    }

    /// The `i`-th embedded string of one embedding file.
    pub fn embedded_string(&self, which: EmbeddingKind, i: usize) -> Result<&str> {
        let f = match which {
            EmbeddingKind::Column => &self.column_emb,
            EmbeddingKind::Categorical => &self.categorical_emb,
            EmbeddingKind::Text => &self.text_emb,
        };
        let offs: &[u64] = f.section(1, None)?;
        let bytes: &[u8] = f.section(2, None)?;
        f.check_elems(1, i, 2, 8)?;
        if i + 1 >= offs.len() {
            return Err(Error::invalid(
                "index",
                format!(
                    "{i} out of range ({} strings)",
                    offs.len().saturating_sub(1)
                ),
            ));
        }
        let (a, b) = (offs[i] as usize, offs[i + 1] as usize);
        let s = bytes.get(a..b).ok_or_else(|| {
            Error::format(
                f.path(),
                format!("string {i} spans {a}..{b}, outside the data"),
            )
        })?;
        f.check_elems(2, a, b - a, 1)?;
        std::str::from_utf8(s)
            .map_err(|e| Error::format(f.path(), format!("string {i} is not UTF-8: {e}")))
    }

    /// Turn read-ahead off on the files read at random (the graph, the
    /// tables, the text embeddings): for a database that does not fit in
    /// the memory the process has ([`super::page_cache`]).
    pub fn advise_random(&self) {
        for f in std::iter::once(&self.graph)
            .chain(&self.tables)
            .chain([&self.text_emb])
        {
            super::page_cache::advise_random(f.map());
        }
    }

    /// Ask the kernel to read every mapped file into the page cache ahead
    /// of use (a hot set's next group, `MADV_WILLNEED`); the bytes asked.
    pub fn prefetch(&self) -> u64 {
        std::iter::once(&self.graph)
            .chain(&self.tables)
            .chain(&self.tasks)
            .chain([&self.text_emb])
            .map(|f| super::page_cache::advise_willneed(f.map()))
            .sum()
    }

    /// Total bytes of all mapped files.
    pub fn bytes_on_disk(&self) -> u64 {
        self.meta.files.values().map(|d| d.bytes).sum::<u64>()
    }
}

/// The `[start, end)` global rows of every table; tables must tile
/// `0..num_rows` in metadata order and fit the `u32` row-id space.
fn table_ranges(meta: &Metadata, meta_path: &Path) -> Result<Vec<(u32, u32)>> {
    let mut out = Vec::with_capacity(meta.tables.len());
    let mut expected = 0u64;
    for t in &meta.tables {
        if t.row_offset != expected {
            return Err(Error::format(
                meta_path,
                format!(
                    "table `{}` row_offset {} expected {expected}",
                    t.name, t.row_offset
                ),
            ));
        }
        let end = expected + t.num_rows;
        let (Ok(lo), Ok(hi)) = (u32::try_from(expected), u32::try_from(end)) else {
            return Err(Error::format(
                meta_path,
                format!(
                    "table `{}` ends at row {end}, beyond the u32 row ids",
                    t.name
                ),
            ));
        };
        out.push((lo, hi));
        expected = end;
    }
    if expected != meta.num_rows {
        return Err(Error::format(meta_path, "tables do not cover num_rows"));
    }
    Ok(out)
}

/// Which embedding file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingKind {
    /// Column-name embeddings.
    Column,
    /// Category embeddings.
    Categorical,
    /// Text-value embeddings.
    Text,
}
