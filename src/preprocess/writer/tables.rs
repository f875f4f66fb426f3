//! `tables/<t>.bin`: a table fed one column at a time (`begin_table` /
//! `add_column` / `end_table`), and its restart record: `parts/<t>.bin`
//! (row times, each foreign key's parent rows, the text values it added)
//! and `parts/<t>.json`, written last, which marks the table complete.
//!
//! With a statistics cutoff, a table with a time column gets its row times
//! before its first column ([`DatabaseWriter::set_row_times`]): one bit per
//! row says which rows feed its columns' statistics (see `past.rs`).
//!
//! Invariants: only one table is open at a time and only one of its columns
//! is held; a column that fails discards the open table and releases the
//! column, category and text indices it allocated. Never: write a restart
//! record for a table that is not complete.

use std::collections::HashSet;
use std::fs;

use super::columns::stream_values;
use super::past::rows_up_to;
use super::resume::TablePart;
use super::{
    check_len, check_name, digest, io, parent_row, ColumnData, ColumnInput, DatabaseWriter,
    ForeignKeyInput, TableInput, TableSpec, PART_CHUNK,
};
use crate::error::{Error, Result};
use crate::format::{
    bit, FileKind, FileWriter, ForeignKeyMeta, MappedFile, Section, SemanticType, TableMeta,
    UnstoredColumn,
};
use crate::preprocess::stats::RunningStats;

/// A table between `begin_table` and `end_table`.
pub(super) struct OpenTable {
    pub(super) spec: TableSpec,
    t: u32,
    row_offset: u64,
    file: String,
    writer: FileWriter,
    text_before: usize,
    cats_before: usize,
    cols_before: usize,
    stored: Vec<u32>,
    unstored: Vec<UnstoredColumn>,
    ts_table: RunningStats,
    seen: HashSet<String>,
    /// With a statistics cutoff and a time column: one bit per row, set
    /// where the row feeds the statistics (`set_row_times`).
    past: Option<Vec<u8>>,
}

impl DatabaseWriter {
    /// Add the next table in one call: [`begin_table`](Self::begin_table),
    /// [`set_row_times`](Self::set_row_times),
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
        if let Err(e) = self.set_row_times(input.row_time) {
            let open = self.open.take().expect("begun above");
            self.discard(open);
            return Err(e);
        }
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
            seen: HashSet::new(),
            past: None,
            spec,
        });
        Ok(())
    }

    /// The open table's row times (µs, `i64::MIN` where undated), before its
    /// first column: with a statistics cutoff and a time column, only rows
    /// dated at or before the cutoff (and undated rows) feed its columns'
    /// statistics. Without either, every row does and nothing is kept.
    /// `end_table` must get the same times.
    pub fn set_row_times(&mut self, row_time: &[i64]) -> Result<()> {
        let cutoff = self.stats_cutoff;
        let open = self
            .open
            .as_mut()
            .ok_or_else(|| Error::Preprocess("set_row_times: no table begun".into()))?;
        let name = &open.spec.name;
        if !open.seen.is_empty() {
            return Err(Error::Preprocess(format!(
                "table `{name}`: row times given after its first column; give them before"
            )));
        }
        check_len(
            &format!("table `{name}` row times"),
            row_time.len(),
            open.spec.num_rows,
        )?;
        open.past = cutoff
            .filter(|_| open.spec.time_column.is_some())
            .map(|c| rows_up_to(row_time, c));
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
        if let (Some(tc), Some(cutoff), None) =
            (&open.spec.time_column, self.stats_cutoff, &open.past)
        {
            return Err(Error::Preprocess(format!(
                "{what}: the database has a statistics cutoff ({cutoff} µs) and the table a time column `{tc}`: give its row times (set_row_times) before its first column"
            )));
        }
        let past = open.past.as_deref();
        let counted = past.map(|m| move |i: usize| bit(m, i));
        let counted = counted.as_ref().map(|f| f as &dyn Fn(usize) -> bool);
        let enc = self.scan(&what, open.spec.num_rows, &c.data, counted)?;
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
            past,
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
        self.check_same_past(&spec.name, past.as_deref(), row_time)?;
        let (len, sum) = writer.finish()?;
        let (fk_meta, fk_refs) = foreign_key_meta(&spec.name, n, foreign_keys)?;
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
            seed_only: false,
        };
        // Restart record: graph inputs + new strings, then the JSON that marks
        // the table complete (written last).
        let graph_part = self.write_part(t, text_before, row_time, foreign_keys)?;
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
    /// Write table `t`'s staged graph inputs, `parts/<t>.bin`: its row
    /// times, each foreign key's parents as u32 (`u32::MAX` = none) and the
    /// text values it added (those from `text_before` on); mapped back, as
    /// `finish` reads them.
    fn write_part(
        &self,
        t: u32,
        text_before: usize,
        row_time: &[i64],
        foreign_keys: &[ForeignKeyInput<'_>],
    ) -> Result<MappedFile> {
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
        MappedFile::open(&part_bin, FileKind::Graph, Some(foreign_keys.len() + 3))
    }
}

/// The metadata of table `table`'s foreign keys (each target resolved in
/// `finish`) and the names of the tables they reference; every key holds a
/// parent per row (`n`).
fn foreign_key_meta(
    table: &str,
    n: usize,
    foreign_keys: &[ForeignKeyInput<'_>],
) -> Result<(Vec<ForeignKeyMeta>, Vec<String>)> {
    let mut fk_meta = Vec::new();
    let mut fk_refs = Vec::new();
    for fk in foreign_keys {
        check_len(
            &format!("table `{table}` foreign key `{}`", fk.column),
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
    Ok((fk_meta, fk_refs))
}

/// Metadata record of a column that is not stored.
fn metadata_unstored(c: &ColumnInput<'_>) -> UnstoredColumn {
    UnstoredColumn {
        name: c.name.clone(),
        stype: c.stype,
        source_type: c.source_type.clone(),
        inferred: c.inferred,
    }
}
