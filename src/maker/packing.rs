//! The packing plan of a sampler: how many seeds each rank draws per step
//! of each task and the segment slots (`K`) of the `[B, K]` tensors, made
//! once when the sampler is made, from a probe of each task's context
//! sizes (`pack_factor = 0`).
//!
//! Never: draw or build a step's contexts (`draw.rs`, `build.rs`).

use rayon::prelude::*;

use super::derive;
use super::SamplerCore;
use crate::batch::auto_count;
use crate::context::Subgraph;

/// Seeds whose contexts are built to measure a task's mean context size
/// for `pack_factor = 0`.
pub const PACK_PROBE: usize = 64;

impl SamplerCore {
    /// Seeds per step and segment slots of every task (see
    /// [`seeds_per_step`](Self::seeds_per_step)).
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    pub(super) fn plan_packing(&mut self) {
        let (b, s) = (
            self.cfg.default_batch_size,
            self.cfg.default_sequence_length,
        );
        self.seeds_per_step = (0..self.tasks.len())
            .map(|k| match (self.cfg.pack, self.cfg.pack_factor) {
                (false, _) => b,
                (true, 0) => {
                    let floor = self.tasks[k].seed_cells.max(1);
                    let fit = (s / floor).clamp(1, 64);
                    auto_count(&self.probe_context_sizes(k), b, s, fit, floor)
                }
                (true, pf) => b * pf,
            })
            .collect();
        let most = self
            .seeds_per_step
            .iter()
            .map(|&n| n.div_ceil(b.max(1)))
            .max()
            .unwrap_or(1);
        self.segment_slots = if most <= 1 { 1 } else { (2 * most).min(255) };
    }

    /// The unpacked context sizes (cells, BFS budget `S`) of up to
    /// [`PACK_PROBE`] seeds spread over task `k`'s seed list (all splits:
    /// only their sizes are read), each BFS with a fixed key: deterministic,
    /// the same on every rank and after a resume. Empty when the task's
    /// seeds cannot be read.
    fn probe_context_sizes(&self, k: usize) -> Vec<usize> {
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        let Ok(task) = mdb.db.task_lazy(plan.local) else {
            return Vec::new();
        };
        let anchor_table = mdb.db.metadata().tasks[plan.local].anchor_table as usize;
        let n = task.anchor_rows.len();
        let probes = n.min(PACK_PROBE);
        let builder = self.context_builder(k);
        let s = self.cfg.default_sequence_length;
        self.pool.install(|| {
            (0..probes)
                .into_par_iter()
                .filter_map(|j| {
                    let i = j * n / probes;
                    task.check_seed(i);
                    let row = task.anchor_rows[i];
                    // A corrupt anchor is reported when a batch draws it.
                    (builder.graph.table_of(row) == Some(anchor_table)).then(|| {
                        let mut sub = Subgraph::default();
                        let key = derive(self.cfg.seed, &[k as u64, i as u64, 3]);
                        builder.build(row, task.obs_times[i], key, s, &mut sub);
                        sub.cells
                    })
                })
                .collect()
        })
    }
}
