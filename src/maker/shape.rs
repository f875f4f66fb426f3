//! The shape of a stream step: its sequence length `S` and its sequences
//! per rank `B`. Fixed (`default_sequence_length`, and the task's seeds per
//! step) unless `sequence_lengths` is set; then each step of the **train**
//! stream draws its `S` from the list and has the config's `B` for it
//! (`SamplerConfig::sequences_at`: `tokens_per_batch / S`) sequences per
//! rank. The val stream keeps the fixed shape, as evaluation
//! passes do (`crate::sampler::eval`): its losses stay comparable from one
//! validation to the next, and the consumer compiles its evaluation step
//! for one shape.
//!
//! Determinism: the draw is a function of (`seed`, split, step) alone — no
//! rank, world size, thread count or stream position — so every rank of a
//! step agrees on `S` (the collectives of a data-parallel step match), and
//! skip, replay and exact or elastic resume (which all continue from the
//! step counter) draw the same `S` again.

use super::{derive, SamplerCore};
use crate::seeds::Split;

impl SamplerCore {
    /// `(S, B)` of step `step` of `split`'s stream, for task `k`: `B` is the
    /// seeds each rank draws (with `pack`, more than the sequences).
    pub fn step_shape(&self, split: Split, k: usize, step: u64) -> (usize, usize) {
        match self.drawn_len(split, step) {
            Some(s) => (s, self.cfg.sequences_at(s)),
            None => (self.cfg.default_sequence_length, self.seeds_per_step[k]),
        }
    }

    /// The sequence length `S` of step `step` of `split`'s stream.
    pub fn step_seq_len(&self, split: Split, step: u64) -> usize {
        self.drawn_len(split, step)
            .unwrap_or(self.cfg.default_sequence_length)
    }

    /// With `sequence_lengths`, on the train stream: the step's drawn `S`
    /// (its `B` is the config's rule, `SamplerConfig::sequences_at`).
    fn drawn_len(&self, split: Split, step: u64) -> Option<usize> {
        let list = &self.cfg.sequence_lengths;
        if self.cfg.tokens_per_batch.is_none() || list.is_empty() || split != Split::Train {
            return None;
        }
        let h = derive(self.cfg.seed, &[split.index() as u64, step, 7]);
        // Uniform up to a bias of len / 2^64.
        Some(list[(h % list.len() as u64) as usize])
    }
}
