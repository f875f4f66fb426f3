//! Hot sets on the train split (`hot_set_bytes`, `crate::seeds::HotSets`):
//! the train picker drawing one group of databases at a time, each span's
//! start counted (`hot_sets/rotations`), the next group read into the
//! page cache a quarter span before its own (`hot_sets/prefetched_bytes`),
//! and the mix the schedule expects, which the mix readings measure the
//! recent picks against.
//!
//! The read-ahead runs on a thread of its own (`MADV_WILLNEED` over each of
//! the group's files: the kernel starts the reads and the thread returns),
//! so a slow disk delays no draw; it changes only when pages arrive, never
//! what a batch holds. The validation split keeps every database (its pass
//! is a measurement over all of them).
//!
//! Never: a choice that depends on the host (the groups and their spans
//! are the picker's, a function of the config, the databases' sizes and the
//! step), or a read-ahead on the draw's thread.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::draw::SplitState;
use super::plan::SamplerCore;
use crate::seeds::{Split, TaskPicker};

impl SamplerCore {
    /// `picker` drawing hot sets, on the train split with `hot_set_bytes`.
    pub(super) fn hot_picker(&self, picker: TaskPicker, split: Split) -> TaskPicker {
        match (self.cfg.hot_set_bytes, split) {
            (Some(budget), Split::Train) => {
                let bytes: Vec<u64> = self.dbs.iter().map(|d| d.db.bytes_on_disk()).collect();
                let task_db: Vec<usize> = self.tasks.iter().map(|t| t.db).collect();
                picker.with_hot_sets(&bytes, budget, self.cfg.hot_set_steps, &task_db)
            }
            _ => picker,
        }
    }

    /// At `step` of `state`: 1 when it starts a span on rank 0 (0 without
    /// hot sets, and on the other ranks), and the next group's read-ahead
    /// started when it is due.
    pub(super) fn hot_step(&self, state: &SplitState, step: u64) -> u32 {
        let Some(h) = state.picker.hot_sets() else {
            return 0;
        };
        if let Some(g) = h.prefetch_at(step) {
            let dbs: Vec<_> = h.members(g).map(|d| Arc::clone(&self.dbs[d].db)).collect();
            let done = Arc::clone(&self.prefetched);
            // Best effort: without a thread the pages come by faults.
            let _ = std::thread::Builder::new()
                .name("headwater-prefetch".into())
                .spawn(move || {
                    let bytes: u64 = dbs.iter().map(|d| d.prefetch()).sum();
                    done.fetch_add(bytes, Ordering::Relaxed);
                });
        }
        // Every rank starts the same spans: rank 0 counts them, so the
        // cluster sum is the run's count.
        u32::from(h.rotates_at(step) && state.rank == 0)
    }

    /// With hot sets, the task mix the schedule expects over the steps the
    /// mix window of `state` covers (it has just recorded `step`):
    /// `mix/tv_distance` measures a span against its group, not against
    /// the whole mixture it is not meant to follow. `None` without.
    pub(super) fn hot_mix(
        &self,
        state: &SplitState,
        step: u64,
        world_size: u32,
    ) -> Option<Vec<f64>> {
        state.picker.hot_sets()?;
        let per_step = if self.mixes_sequences() {
            u64::from(world_size) * self.step_shape(state.split, 0, step).1 as u64
        } else {
            1
        };
        let steps = (state.stream.mix.len() as u64)
            .div_ceil(per_step.max(1))
            .max(1);
        let first = (step + 1).saturating_sub(steps);
        state.picker.expected_mix(first..step + 1, self.tasks.len())
    }

    /// Bytes read ahead since the last call (reported with one batch).
    pub(super) fn take_prefetched(&self) -> u64 {
        self.prefetched.swap(0, Ordering::Relaxed)
    }
}
