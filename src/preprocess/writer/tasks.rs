//! `tasks/<k>.bin`: cell tasks (a stored column's non-null cells as seeds)
//! and tasks whose targets are supplied (SQL queries, imported labels).
//!
//! Invariants: a task's anchors are global row ids of its anchor table, its
//! observation times are `i64::MAX` for a non-temporal seed, and a supplied
//! target becomes a virtual column of the anchor table, whose statistics
//! come from its train seeds up to the cutoff (`past.rs`). Never: hold a
//! per-seed array; every section is streamed a chunk of seeds at a time.

use super::columns::stream_values;
use super::{
    check_len, check_name, digest, ColumnData, DatabaseWriter, TaskInput, TaskTarget, PART_CHUNK,
};
use crate::error::{Error, Result};
use crate::format::{
    bit, pack_bits, ColumnMeta, FileKind, FileWriter, MappedFile, Section, Split, TaskMeta,
};

impl DatabaseWriter {
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
        let (t, col) = self.cell_target(name, table, column)?;
        let tm = &self.tables[t];
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
        stream_seeds(&mut w, seeds(), 1, |r, buf: &mut Vec<u32>| {
            buf.push(base + r as u32);
        })?;
        stream_seeds(&mut w, seeds(), 1, |r, buf: &mut Vec<i64>| {
            let o = match row_time[r] {
                i64::MIN => i64::MAX,
                t => t,
            };
            temporal |= o != i64::MAX;
            buf.push(o);
        })?;
        stream_seeds(&mut w, seeds(), size, |r, buf: &mut Vec<u8>| {
            buf.extend_from_slice(&raw[r * size..(r + 1) * size]);
        })?;
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
            label_time_column: None,
            label_columns: Vec::new(),
            window_us: None,
            candidate_recall: None,
        };
        self.files.insert(file, digest(len, sum));
        self.tasks.push(meta);
        Ok(())
    }

    /// When cell task `name`'s labels become known: `time_column` (a
    /// timestamp column of its anchor table; `None`: each row's own time)
    /// and the `columns` of the anchor table known only with the label.
    pub fn set_label_rule(
        &mut self,
        name: &str,
        time_column: Option<&str>,
        columns: &[&str],
    ) -> Result<()> {
        let k = self
            .tasks
            .iter()
            .position(|k| k.name == name && k.kind == "cell")
            .ok_or_else(|| {
                Error::Preprocess(format!("task `{name}`: no cell task of that name"))
            })?;
        let t = self.tasks[k].anchor_table as usize;
        let table = &self.tables[t];
        let find = |key: &str, col: &str| {
            self.stored_column(t, col)
                .map(|c| (c.idx, c.stype))
                .ok_or_else(|| {
                    Error::Preprocess(format!(
                        "task `{name}`.{key}: table `{}` has no stored column `{col}`",
                        table.name
                    ))
                })
        };
        let time = match time_column {
            Some(col) => {
                let (idx, stype) = find("label_time_column", col)?;
                if stype != crate::format::SemanticType::Timestamp {
                    return Err(Error::Preprocess(format!(
                        "task `{name}`.label_time_column: `{}.{col}` is {}, not a timestamp",
                        table.name,
                        stype.name()
                    )));
                }
                Some(idx)
            }
            None => None,
        };
        let target = self.tasks[k].target_column;
        let mut hidden = Vec::with_capacity(columns.len());
        for col in columns {
            let (idx, _) = find("label_columns", col)?;
            if idx != target && !hidden.contains(&idx) {
                hidden.push(idx);
            }
        }
        let task = &mut self.tasks[k];
        task.label_time_column = time;
        task.label_columns = hidden;
        Ok(())
    }

    /// Query task `name`'s label window Δ (µs, > 0): each label covers
    /// (observation, observation + Δ] and is known at its end.
    pub fn set_window(&mut self, name: &str, window_us: i64) -> Result<()> {
        let task = self
            .tasks
            .iter_mut()
            .find(|k| k.name == name && k.kind != "cell")
            .ok_or_else(|| {
                Error::Preprocess(format!("task `{name}`: no query task of that name"))
            })?;
        if window_us <= 0 {
            return Err(Error::Preprocess(format!(
                "task `{name}`.window: {window_us} µs; expected a positive duration"
            )));
        }
        task.window_us = Some(window_us);
        Ok(())
    }

    /// Link task `name`'s candidate recall on its training groups: the
    /// share of their positives the candidate generator found, in [0, 1].
    pub fn set_candidate_recall(&mut self, name: &str, share: f64) -> Result<()> {
        let task = self
            .tasks
            .iter_mut()
            .find(|k| k.name == name && k.kind == "link")
            .ok_or_else(|| {
                Error::Preprocess(format!("task `{name}`: no link task of that name"))
            })?;
        if !(0.0..=1.0).contains(&share) {
            return Err(Error::Preprocess(format!(
                "task `{name}`: candidate recall {share}; expected a share in [0, 1]"
            )));
        }
        task.candidate_recall = Some(share);
        Ok(())
    }

    /// Table `name` is reached only as a seed: the graph gets no reverse
    /// edge into its rows (a link task's candidate pairs; see
    /// `TableMeta::seed_only`).
    pub fn set_seed_only(&mut self, name: &str) -> Result<()> {
        let table = self
            .tables
            .iter_mut()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::Preprocess(format!("table `{name}`: no table of that name")))?;
        table.seed_only = true;
        Ok(())
    }

    /// The stored column `name` of table `t`, if it has one.
    fn stored_column(&self, t: usize, name: &str) -> Option<&ColumnMeta> {
        self.tables[t]
            .columns
            .iter()
            .map(|&c| &self.columns[c as usize])
            .find(|c| c.name == name)
    }

    /// The anchor table and target column of cell task `name`: a stored
    /// column of `table` that a decoder head predicts.
    fn cell_target(&self, name: &str, table: &str, column: &str) -> Result<(usize, ColumnMeta)> {
        let t = self.table_index(table).ok_or_else(|| {
            Error::Preprocess(format!("task `{name}`: unknown anchor table `{table}`"))
        })?;
        let col = self.stored_column(t, column).cloned().ok_or_else(|| {
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
        Ok((t, col))
    }

    /// The anchor table of supplied task `input`, after checking its rows:
    /// at least one, an observation time (and a stored split code, if any)
    /// per row, each anchor a row of the table.
    fn check_task_rows(&self, input: &TaskInput<'_>) -> Result<usize> {
        let name = &input.name;
        let t = self.table_index(&input.anchor_table).ok_or_else(|| {
            Error::Preprocess(format!(
                "task `{name}`: unknown anchor table `{}`",
                input.anchor_table
            ))
        })?;
        let tm = &self.tables[t];
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
        Ok(t)
    }

    /// A task whose targets are supplied (SQL query or imported labels).
    pub fn add_task(&mut self, input: TaskInput<'_>) -> Result<()> {
        self.check_task_name(&input.name)?;
        let name = input.name.clone();
        let t = self.check_task_rows(&input)?;
        let tm = self.tables[t].clone();
        let n = input.anchor_rows.len();
        let k = self.tasks.len();
        // The target's statistics leave out the val/test seeds and those
        // observed after the cutoff (`past.rs`).
        let rule = self.seed_rule(k as u32, tm.row_offset as u32, &input);
        let TaskTarget::Values { stype, data } = input.target;
        if !stype.is_target() {
            return Err(Error::Preprocess(format!(
                "task `{name}`: target semantic type {} has no decoder head",
                stype.name()
            )));
        }
        let counted = |i: usize| rule.counts(i);
        let enc = self.scan(&format!("task `{name}` target"), n, &data, Some(&counted))?;
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
            label_time_column: None,
            label_columns: Vec::new(),
            window_us: None,
            candidate_recall: None,
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
}

/// Write one section of a cell task: `each` appends `per_seed` values of
/// seed row `r`, flushed every [`PART_CHUNK`] seeds, so no per-seed array
/// is held.
fn stream_seeds<T: bytemuck::Pod>(
    w: &mut FileWriter,
    seeds: impl Iterator<Item = usize>,
    per_seed: usize,
    mut each: impl FnMut(usize, &mut Vec<T>),
) -> Result<()> {
    let mut buf: Vec<T> = Vec::with_capacity(PART_CHUNK * per_seed);
    w.begin_section()?;
    for r in seeds {
        each(r, &mut buf);
        if buf.len() >= PART_CHUNK * per_seed {
            w.append(Section::of(&buf))?;
            buf.clear();
        }
    }
    w.append(Section::of(&buf))
}
