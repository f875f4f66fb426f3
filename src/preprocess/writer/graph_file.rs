//! `graph.bin`, written by `finish` once every table is in: each foreign key
//! resolved to the table it references, then the dense row → table map, the
//! row times and the CSR in both directions (see [`crate::format`]).
//!
//! Invariants: a foreign key's parents are checked against the referenced
//! table's size before any edge is written; global parent ids are the
//! referenced table's `row_offset` plus the local row. Never: hold the row
//! times or the reverse CSR in private memory; both live in spill files
//! read from the page cache.

use super::{digest, DatabaseWriter};
use crate::error::{Error, Result};
use crate::format::{FileKind, FileWriter, Section};
use crate::spill::{build_reverse, write_forward, write_reverse, SpillArray};

impl DatabaseWriter {
    /// Point every foreign key at the table it names, now that every table
    /// is known, refusing an unknown table or a parent row past its end.
    pub(super) fn resolve_foreign_keys(&mut self) -> Result<()> {
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
        Ok(())
    }

    /// Write `graph.bin` from the staged parts of every table; the number of
    /// edges and of reverse edges (fewer when a table is seed-only).
    pub(super) fn write_graph(&mut self) -> Result<(u64, u64)> {
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
        let offsets: Vec<u64> = self.tables.iter().map(|t| t.row_offset).collect();
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
        // A seed-only table's rows are no parent's children: no reverse
        // edge leads into them.
        let seed_only: Vec<bool> = tables.iter().map(|t| t.seed_only).collect();
        let reachable = |r: usize, out: &mut Vec<u32>| {
            if !seed_only[bounds.partition_point(|&b| b <= r as u64)] {
                parents(r, out);
            }
        };
        let rev = build_reverse(&self.staging, n, &row_time, reachable)?;
        let num_reverse = rev.rev_targets.len() as u64;
        write_reverse(&mut w, &rev, &row_time)?;
        drop(rev);
        drop(row_time);
        let (len, sum) = w.finish()?;
        self.files.insert("graph.bin".into(), digest(len, sum));
        Ok((num_edges, num_reverse))
    }
}
