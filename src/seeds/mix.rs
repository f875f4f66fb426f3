//! The realised task mix: a sliding window of recent picks (the pool and
//! mix readings taken after each draw are `crate::readings::DrawReadings`).

use std::collections::VecDeque;

/// Sliding window of recent task picks, for the realised mix.
#[derive(Debug, Clone)]
pub struct MixWindow {
    picks: VecDeque<u32>,
    counts: Vec<u64>,
    cap: usize,
}

impl MixWindow {
    /// An empty window over `num_tasks` tasks holding the last `cap` picks.
    pub fn new(num_tasks: usize, cap: usize) -> Self {
        MixWindow {
            picks: VecDeque::with_capacity(cap),
            counts: vec![0; num_tasks],
            cap,
        }
    }

    /// Record a pick, forgetting the oldest when full.
    pub fn push(&mut self, task: u32) {
        if self.picks.len() == self.cap {
            if let Some(old) = self.picks.pop_front() {
                self.counts[old as usize] -= 1;
            }
        }
        self.picks.push_back(task);
        self.counts[task as usize] += 1;
    }

    /// The picks in the window, oldest first (for the sampler state).
    pub fn picks(&self) -> impl Iterator<Item = u32> + '_ {
        self.picks.iter().copied()
    }
    /// Picks in the window.
    pub fn len(&self) -> usize {
        self.picks.len()
    }
    /// No pick yet.
    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }
    /// Picks of `task` in the window.
    pub fn count(&self, task: usize) -> u64 {
        self.counts[task]
    }

    /// Total-variation distance between the window's mix and `weights`
    /// (normalised over the tasks with weight > 0).
    #[allow(clippy::cast_precision_loss)]
    pub fn tv_distance(&self, weights: &[f64]) -> f64 {
        let total_w: f64 = weights.iter().filter(|w| **w > 0.0).sum();
        let n = self.picks.len() as f64;
        if n == 0.0 || total_w <= 0.0 {
            return 0.0;
        }
        0.5 * weights
            .iter()
            .zip(&self.counts)
            .map(|(&w, &c)| (c as f64 / n - w.max(0.0) / total_w).abs())
            .sum::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tv_distance_of_matching_and_skewed_mixes() {
        let mut w = MixWindow::new(3, 4);
        for t in [0, 1, 0, 1] {
            w.push(t);
        }
        assert!((w.tv_distance(&[1.0, 1.0, 0.0]) - 0.0).abs() < 1e-12);
        // Task 2 configured but never picked.
        assert!((w.tv_distance(&[1.0, 1.0, 2.0]) - 0.5).abs() < 1e-12);
        // The window slides.
        for _ in 0..4 {
            w.push(2);
        }
        assert_eq!((w.count(0), w.count(2)), (0, 4));
    }
}
