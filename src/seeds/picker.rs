//! Choosing one task per batch: a pure function of the step, the same on
//! every rank.

use crate::config::TaskPick;
use crate::rng::mix64;

/// Picks the task of each step among the tasks with weight > 0 whose global
/// pool in the split is not empty. Stateless: `pick(step)` depends only on
/// the construction arguments and `step`, so every rank picks the same task
/// at the same step whatever its rank, world size or history.
#[derive(Debug, Clone)]
pub struct TaskPicker {
    mode: TaskPick,
    /// (task index, cumulative weight) of eligible tasks with weight > 0.
    cumulative: Vec<(u32, f64)>,
    key: u64,
}

impl TaskPicker {
    /// `weights[k]` for every task; `eligible[k]` = task has seeds in the
    /// split; `key` seeds the weighted choice (derived from seed and split).
    pub fn new(mode: TaskPick, weights: &[f64], eligible: &[bool], key: u64) -> Self {
        let mut acc = 0.0;
        let mut cumulative = Vec::new();
        for (k, (&w, &ok)) in weights.iter().zip(eligible).enumerate() {
            if ok && w > 0.0 {
                acc += w;
                cumulative.push((k as u32, acc));
            }
        }
        TaskPicker {
            mode,
            cumulative,
            key,
        }
    }

    /// Tasks that can be picked.
    pub fn tasks(&self) -> impl Iterator<Item = u32> + '_ {
        self.cumulative.iter().map(|&(k, _)| k)
    }

    /// No task can be picked (no weighted task has seeds here).
    pub fn is_empty(&self) -> bool {
        self.cumulative.is_empty()
    }

    /// The task of `step` (the picker must not be empty). Round robin cycles
    /// through the eligible tasks in index order; weighted draws
    /// `u = mix64(key ^ mix64(step)) / 2^64` and takes the first task whose
    /// cumulative weight exceeds `u · total`.
    pub fn pick(&self, step: u64) -> u32 {
        match self.mode {
            TaskPick::RoundRobin => {
                self.cumulative[(step % self.cumulative.len() as u64) as usize].0
            }
            TaskPick::Weighted => {
                let total = self.cumulative.last().map_or(0.0, |c| c.1);
                let bits = mix64(self.key ^ mix64(step.wrapping_add(0xD1B5_4A32_D192_ED03)));
                let x = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * total;
                let i = self.cumulative.partition_point(|&(_, c)| c <= x);
                self.cumulative[i.min(self.cumulative.len() - 1)].0
            }
        }
    }
}

impl TaskPicker {
    /// The task of global sequence slot `slot` of step `step` when each
    /// sequence draws its own (`task_mixing = "sequence"`), with
    /// `per_step` slots per step: weighted, from its own hash of (step,
    /// slot); round robin, cycling over the step's slots in order.
    pub fn pick_slot(&self, step: u64, slot: u64, per_step: u64) -> u32 {
        match self.mode {
            TaskPick::RoundRobin => {
                let n = self.cumulative.len() as u64;
                let i = step.wrapping_mul(per_step).wrapping_add(slot) % n;
                self.cumulative[i as usize].0
            }
            TaskPick::Weighted => {
                let total = self.cumulative.last().map_or(0.0, |c| c.1);
                let h = mix64(step.wrapping_add(0x9E37_79B9_7F4A_7C15))
                    ^ slot.wrapping_mul(0xA24B_AED4_963E_E407);
                let bits = mix64(self.key ^ 0x5EC5_0000_0000_0001 ^ mix64(h));
                let x = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * total;
                let i = self.cumulative.partition_point(|&(_, c)| c <= x);
                self.cumulative[i.min(self.cumulative.len() - 1)].0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_follows_weights_and_skips_ineligible() {
        let p = TaskPicker::new(
            TaskPick::Weighted,
            &[1.0, 3.0, 5.0, 0.0],
            &[true, true, false, true],
            1,
        );
        let mut c = [0u32; 4];
        for step in 0..40_000 {
            c[p.pick(step) as usize] += 1;
        }
        assert_eq!((c[2], c[3]), (0, 0));
        assert!((c[1] as f64 / c[0] as f64 - 3.0).abs() < 0.15, "{c:?}");
        // A pure function of the step.
        assert_eq!(p.pick(12_345), p.clone().pick(12_345));
        let rr = TaskPicker::new(
            TaskPick::RoundRobin,
            &[1.0, 1.0, 1.0],
            &[true, false, true],
            1,
        );
        let seq: Vec<u32> = (0..4).map(|s| rr.pick(s)).collect();
        assert_eq!(seq, vec![0, 2, 0, 2]);
    }
}
