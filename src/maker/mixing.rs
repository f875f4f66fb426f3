//! Mixed-task steps (`task_mixing = "sequence"`): each global sequence
//! slot of a step draws its own task by the task weights, from a hash of
//! (step, slot) under the split's picker key — a function of the stream
//! state alone, like a step's task, so batches are the same on every thread
//! count, on replay and after resume.
//!
//! A task's pool is consumed in global slot order: the step's slots that
//! drew task `k` take its pool positions `drawn[k]`, `drawn[k] + 1`, … in
//! slot order, over every rank; the rank builds its own slots. A rank's
//! sequences are laid out by (task, slot), so each task's sequences are
//! one contiguous group (`build.rs` builds a group per task).
//!
//! Never: a change to the one-task path (`task_mixing = "step"` never
//! enters this file).

use super::derive;
use super::draw::{Draws, SplitState};
use super::plan::{SamplerCore, TaskGroup};
use crate::config::TaskMixing;

impl SamplerCore {
    /// Whether each sequence draws its own task.
    pub(super) fn mixes_sequences(&self) -> bool {
        self.cfg.task_mixing == TaskMixing::Sequence
    }

    /// The step's `(S, B)`: unpacked (mixing refuses `pack`), `B` is the
    /// same for every task.
    fn mixed_shape(&self, state: &SplitState) -> (usize, usize) {
        self.step_shape(state.split, 0, state.stream.step)
    }

    /// The task of every global slot of `state`'s current step (`world_size`
    /// ranks of `B` slots each) and the (task, slots) counts, tasks ascending.
    fn slot_tasks(&self, state: &SplitState, world_size: u32) -> (Vec<u32>, Vec<(u32, u64)>) {
        let per_step = u64::from(world_size) * self.mixed_shape(state).1 as u64;
        let step = state.stream.step;
        let tasks: Vec<u32> = (0..per_step)
            .map(|g| state.picker.pick_slot(step, g, per_step))
            .collect();
        let mut n = vec![0u64; self.tasks.len()];
        for &k in &tasks {
            n[k as usize] += 1;
        }
        let counts = n
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(k, &c)| (k as u32, c))
            .collect();
        (tasks, counts)
    }

    /// Draw this rank's sequences of the current step, each of its own
    /// task, into `jobs` (grouped by task), and advance the stream.
    pub(super) fn draw_mixed(
        &self,
        state: &mut SplitState,
        jobs: &mut Vec<(u32, u32, i64, u64)>,
        world_size: u32,
    ) -> crate::error::Result<Draws> {
        let step = state.stream.step;
        let key = self.step_key(state.split, step);
        let (tasks, counts) = self.slot_tasks(state, world_size);
        let (seq_len, b) = self.mixed_shape(state);
        let b = b as u64;
        let first = u64::from(state.rank) * b;
        // (task, global slot, pool position) of this rank's slots.
        let mut seen = vec![0u64; self.tasks.len()];
        let mut mine = Vec::with_capacity(b as usize);
        for (g, &k) in tasks.iter().enumerate() {
            let k = k as usize;
            let pos = state.stream.drawn[k] + seen[k];
            seen[k] += 1;
            if (first..first + b).contains(&(g as u64)) {
                mine.push((k, g as u64, pos));
            }
        }
        mine.sort_unstable();
        let mut d = Draws {
            task: mine.first().map_or(0, |m| m.0),
            seq_len,
            step,
            key,
            world_size,
            exhaust_events: 0,
            window_rotations: 0,
            hot_set_rotations: self.hot_step(state, step),
            duplicates: 0,
            groups: Vec::new(),
            drawn: counts.clone(),
        };
        jobs.clear();
        for (k, g, pos) in mine {
            let task = self.task_lazy(k)?;
            let x = state.pool(k, &self.cfg)?.at(pos);
            d.exhaust_events += x.exhausted as u32;
            d.window_rotations += x.window_opened as u32;
            d.duplicates += x.duplicate as u32;
            let i = x.seed as usize;
            task.check_seed(i);
            match d.groups.last_mut() {
                Some(last) if last.0 == k => last.1.end += 1,
                _ => d.groups.push((k, jobs.len()..jobs.len() + 1)),
            }
            jobs.push((
                x.seed,
                task.anchor_rows[i],
                task.obs_times[i],
                derive(key, &[g]),
            ));
        }
        // A seed entry read from a corrupt block fails the draw, naming it
        // (the step's databases only: one dropped mid-run stays corrupt).
        for &(k, _) in &counts {
            self.dbs[self.tasks[k as usize].db].db.integrity().check()?;
        }
        state.stream.advance_counts(&counts);
        Ok(d)
    }

    /// Advance `state` past its current step without drawing its seeds.
    pub(super) fn skip_mixed(&self, state: &mut SplitState) {
        let world_size = state.stream.world_size_at(state.stream.step);
        let (_, counts) = self.slot_tasks(state, world_size);
        state.stream.advance_counts(&counts);
    }
}

/// The fingerprint of a mixed step: the one-task fingerprint `fp` and each
/// task group (task, sequences).
pub(super) fn mixed_fingerprint(fp: u64, groups: &[TaskGroup]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&fp.to_le_bytes());
    for (k, r) in groups {
        h.update(&(*k as u32).to_le_bytes());
        h.update(&(r.len() as u32).to_le_bytes());
    }
    h.digest()
}
