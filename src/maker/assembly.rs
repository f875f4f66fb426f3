//! Assembling a built step: each sequence's tensors from its contexts
//! (each sequence with its own task's assembly context, so a batch may mix
//! tasks and databases) and the batch's text collation, with the block
//! checks of every database read, and the residency probe of the pages
//! it is about to read (`reads.rs`).
//!
//! Never: a random choice, or a BFS (the contexts are `build.rs`'s).

use std::cell::RefCell;

use super::draw::BuildBuffers;
use super::plan::{SamplerCore, TargetPlan, TaskGroup};
use crate::batch::{
    assemble_packed_sequence, collate_text, collate_text_mixed, AssembleScratch, Batch, LabelCells,
    SeqContext, TableCells, Target,
};
use crate::context::{LabelTimes, Subgraph};
use crate::databases::in_database;
use crate::error::Result;
use crate::readings::SeqReadings;

thread_local! {
    static SCRATCH: RefCell<AssembleScratch> = RefCell::new(AssembleScratch::default());
}

impl SamplerCore {
    /// Assemble the sequences of `layout` into a batch of the tasks of
    /// `groups` and length `s` (the step's `S`; the seeds of `jobs`), with
    /// each sequence's readings.
    pub(super) fn assemble(
        &self,
        groups: &[TaskGroup],
        s: usize,
        jobs: &[(u32, u32, i64, u64)],
        layout: &Layout<'_>,
        min_len: usize,
    ) -> Result<(Batch, Vec<SeqReadings>, (u32, u32))> {
        let asm_span = tracing::info_span!("assemble", max_rows = tracing::field::Empty).entered();
        let Layout {
            start,
            seeds,
            subgraphs,
            slots,
        } = *layout;
        let b = start.len() - 1;
        let r = start
            .windows(2)
            .map(|w| {
                subgraphs[w[0]..w[1]]
                    .iter()
                    .map(|g| g.rows.len())
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let plan = &self.tasks[groups[0].0];
        let dim = self.dbs[plan.db].db.metadata().embedder.dim as usize;
        let mut batch = Batch::unfilled(b, s, r, slots, dim);
        batch.task_idx = groups[0].0 as u32;
        batch.db_idx = plan.db as u32;
        batch.target_stype = plan.stype_code;
        batch.cat_emb_start = plan.cat_emb_start;
        batch.cat_emb_count = plan.cat_emb_count;
        batch.seeds.extend(jobs.iter().map(|j| j.0));
        // Sequence `q`'s group: packed (one group) every sequence is group
        // 0; unpacked, sequence `q` is job `q`.
        let mut seq_group = vec![0usize; b];
        for (g, (gk, range)) in groups.iter().enumerate() {
            let p = &self.tasks[*gk];
            for q in range.clone().filter(|&q| q < b) {
                seq_group[q] = g;
            }
            for q in (0..b).filter(|&q| seq_group[q] == g) {
                batch.seq_task_idx[q] = *gk as u32;
                batch.seq_db_idx[q] = p.db as u32;
                batch.seq_target_stype[q] = p.stype_code;
                batch.seq_cat_emb_start[q] = p.cat_emb_start;
                batch.seq_cat_emb_count[q] = p.cat_emb_count;
            }
        }
        let tables = groups
            .iter()
            .map(|(gk, _)| table_cells(&self.dbs[self.tasks[*gk].db].db))
            .collect::<Result<Vec<_>>>()?;
        let ctxs = groups
            .iter()
            .zip(&tables)
            .map(|((gk, _), t)| self.seq_context(*gk, t))
            .collect::<Result<Vec<_>>>()?;
        // Before any cell is read: which of the pages about to be read
        // the page cache already holds (`reads.rs`).
        let group_of = |g: usize| groups.iter().position(|(_, r)| r.contains(&g)).unwrap_or(0);
        let residency = super::reads::probe_residency(subgraphs, jobs, group_of, &tables);
        let seqs = self.pool.install(|| {
            batch.fill_sequences(min_len, |i, o, seg| {
                let range = start[i]..start[i + 1];
                let (subs, seeds) = (&subgraphs[range.clone()], &seeds[range]);
                SCRATCH.with(|sc| {
                    let ctx = &ctxs[seq_group[i]];
                    assemble_packed_sequence(ctx, subs, seeds, r, o, seg, &mut sc.borrow_mut())
                })
            })
        });
        asm_span.record("max_rows", r as i64);
        Ok((batch, seqs, residency))
    }

    /// The assembly context of task `k` over its database's `tables`.
    fn seq_context<'a>(&'a self, k: usize, tables: &'a [TableCells<'a>]) -> Result<SeqContext<'a>> {
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        let db = &*mdb.db;
        let m = db.metadata();
        // The seeds' entries were checked as they were drawn (`draw.rs`).
        let task = db.task_lazy(plan.local)?;
        let target = match plan.target {
            TargetPlan::Cell { slot } => Target::Cell { slot },
            TargetPlan::Virtual { column_idx, code } => Target::Virtual {
                column_idx,
                code,
                values: task.targets,
                validity: task.target_validity,
            },
        };
        let labels = self.label_slots(k).map(|l| {
            let tc = &tables[l.table];
            LabelCells {
                table: l.table,
                slots: l.slots,
                times: LabelTimes {
                    row_offset: tc.row_offset,
                    column: l.time.map(|s| tc.columns[s]),
                },
                hide: self.cfg.temporal_filter,
            }
        });
        Ok(SeqContext {
            graph: db.graph(),
            tables,
            labels,
            obs_times: task.obs_times,
            window: m.tasks[plan.local].window_us,
            count_positives: m.tasks[plan.local].kind == "link",
            ts_mean: m.timestamp_stats.mean_us,
            ts_std: m.timestamp_stats.std_us,
            target,
            num_categorical: u32::try_from(m.num_categorical_embeddings).unwrap_or(u32::MAX),
            num_text: u32::try_from(m.num_text_embeddings).unwrap_or(u32::MAX),
            column_offset: mdb.column_offset,
            categorical_offset: mdb.categorical_offset,
        })
    }

    /// Cell task `k`'s label cells (`None`: a task whose target is not a
    /// column of its anchor table).
    pub(super) fn label_slots(&self, k: usize) -> Option<LabelSlots> {
        let plan = &self.tasks[k];
        let TargetPlan::Cell { slot } = plan.target else {
            return None;
        };
        let m = self.dbs[plan.db].db.metadata();
        let km = &m.tasks[plan.local];
        let slot_of = |c: u32| m.columns[c as usize].slot.map(|s| s as usize);
        // The label time is known with the label: hidden with it.
        let time = km.label_time_column.and_then(slot_of);
        let mut slots = vec![slot];
        slots.extend(km.label_columns.iter().filter_map(|&c| slot_of(c)));
        slots.extend(time);
        Some(LabelSlots {
            table: km.anchor_table as usize,
            slots,
            time,
        })
    }

    /// Collate the batch's texts (each sequence's from its database) and
    /// check every block read so far: a corrupt one stops the batch here.
    pub(super) fn collate(
        &self,
        batch: &mut Batch,
        groups: &[TaskGroup],
        buffers: &mut BuildBuffers,
    ) -> Result<()> {
        let mut dbs: Vec<usize> = groups.iter().map(|g| self.tasks[g.0].db).collect();
        dbs.sort_unstable();
        dbs.dedup();
        if let [d] = dbs[..] {
            let db = &*self.dbs[d].db;
            collate_text(batch, db.text_embedding_rows()?, &mut buffers.text_map);
        } else {
            let rows = self
                .dbs
                .iter()
                .map(|d| d.db.text_embedding_rows())
                .collect::<Result<Vec<_>>>()?;
            let seq_db = batch.seq_db_idx.clone();
            collate_text_mixed(batch, &rows, &seq_db, &mut buffers.text_map_mixed);
        }
        // Every read above checked its block (on this thread, or on the
        // pool's before the join).
        for d in dbs {
            let mdb = &self.dbs[d];
            mdb.db
                .integrity()
                .check()
                .map_err(|e| in_database(&mdb.name, e))?;
        }
        Ok(())
    }
}

/// Where a cell task's label cells are in its anchor table.
pub(super) struct LabelSlots {
    /// The anchor table.
    pub(super) table: usize,
    /// Slots of the target, the task's `label_columns` and its label time.
    pub(super) slots: Vec<usize>,
    /// Slot of the `label_time_column`, if any.
    pub(super) time: Option<usize>,
}

/// How a batch's contexts are laid out over its sequences.
#[derive(Clone, Copy)]
pub(super) struct Layout<'a> {
    /// Sequence `q` holds contexts `start[q]..start[q + 1]`.
    pub(super) start: &'a [usize],
    /// The contexts' seeds, in layout order.
    pub(super) seeds: &'a [u32],
    /// The contexts, in layout order.
    pub(super) subgraphs: &'a [Subgraph],
    /// Segment slots per sequence (`K`).
    pub(super) slots: usize,
}

/// Every table of `db` as stored columns with their cell type codes.
fn table_cells(db: &crate::format::Database) -> Result<Vec<TableCells<'_>>> {
    let m = db.metadata();
    (0..m.tables.len())
        .map(|t| {
            let v = db.table(t)?;
            let codes = v
                .columns
                .iter()
                .map(|c| m.columns[c.column_idx as usize].stype.code().unwrap_or(0) as i8)
                .collect();
            Ok(TableCells {
                row_offset: v.row_offset,
                columns: v.columns,
                codes,
            })
        })
        .collect()
}
