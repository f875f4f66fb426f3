//! Choosing one task per batch.

use crate::config::TaskPick;
use crate::rng::Xoshiro256pp;

/// Picks the task of each batch among the tasks that have seeds on this rank.
#[derive(Debug, Clone)]
pub struct TaskPicker {
    mode: TaskPick,
    /// (task index, cumulative weight) of eligible tasks with weight > 0.
    cumulative: Vec<(u32, f64)>,
    next_rr: usize,
}

impl TaskPicker {
    /// `weights[k]` for every task; `eligible[k]` = task has seeds here.
    pub fn new(mode: TaskPick, weights: &[f64], eligible: &[bool]) -> Self {
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
            next_rr: 0,
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

    /// The task of the next batch.
    pub fn pick(&mut self, rng: &mut Xoshiro256pp) -> u32 {
        match self.mode {
            TaskPick::RoundRobin => {
                let k = self.cumulative[self.next_rr % self.cumulative.len()].0;
                self.next_rr += 1;
                k
            }
            TaskPick::Weighted => {
                let total = self.cumulative.last().map_or(0.0, |c| c.1);
                let x = rng.next_f64() * total;
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
        let mut p = TaskPicker::new(
            TaskPick::Weighted,
            &[1.0, 3.0, 5.0, 0.0],
            &[true, true, false, true],
        );
        let mut rng = Xoshiro256pp::seed_from_u64(1);
        let mut c = [0u32; 4];
        for _ in 0..40_000 {
            c[p.pick(&mut rng) as usize] += 1;
        }
        assert_eq!((c[2], c[3]), (0, 0));
        assert!((c[1] as f64 / c[0] as f64 - 3.0).abs() < 0.15, "{c:?}");
        let mut rr = TaskPicker::new(TaskPick::RoundRobin, &[1.0, 1.0, 1.0], &[true, false, true]);
        let seq: Vec<u32> = (0..4).map(|_| rr.pick(&mut rng)).collect();
        assert_eq!(seq, vec![0, 2, 0, 2]);
    }
}
