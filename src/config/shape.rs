//! The shapes a config's steps take, stated once: `S` cells per sequence
//! and `B` sequences per rank, for each step of the train stream and for
//! the val stream and evaluation passes. The maker draws each train step's
//! `S` (`crate::maker`); its `B` is always [`SamplerConfig::sequences_at`].
//! The trainer reads the same rule through the binding (`step_shapes`)
//! rather than deriving it from the keys again.
//!
//! Invariants: with `sequence_lengths`, a train step of `S` has
//! `tokens_per_batch / S` sequences (validation keeps it whole); without,
//! every step is `(default_sequence_length, default_batch_size)`; the val
//! stream and evaluation passes always keep that fixed shape.

use serde::Serialize;

use super::SamplerConfig;

/// One step's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepShape {
    /// Cells per sequence.
    #[serde(rename = "S")]
    pub s: usize,
    /// Sequences per rank.
    #[serde(rename = "B")]
    pub b: usize,
}

impl SamplerConfig {
    /// Sequences per rank of a train step of `S = s`: `tokens_per_batch /
    /// s` with a token budget, else `default_batch_size`.
    pub fn sequences_at(&self, s: usize) -> usize {
        self.tokens_per_batch
            .map_or(self.default_batch_size, |tokens| tokens / s.max(1))
    }

    /// Every shape a train step may take, in `sequence_lengths` order (the
    /// fixed shape alone without the list).
    pub fn train_shapes(&self) -> Vec<StepShape> {
        if self.sequence_lengths.is_empty() || self.tokens_per_batch.is_none() {
            return vec![self.fixed_shape()];
        }
        self.sequence_lengths
            .iter()
            .map(|&s| StepShape {
                s,
                b: self.sequences_at(s),
            })
            .collect()
    }

    /// The shape of the val stream and of evaluation passes (and of every
    /// train step without `sequence_lengths`).
    pub fn fixed_shape(&self) -> StepShape {
        StepShape {
            s: self.default_sequence_length,
            b: self.default_batch_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_budget_gives_each_length_its_batch_and_eval_keeps_the_fixed_shape() {
        let fixed = SamplerConfig {
            default_batch_size: 8,
            default_sequence_length: 256,
            ..SamplerConfig::default()
        };
        assert_eq!(fixed.train_shapes(), [StepShape { s: 256, b: 8 }]);
        let varlen = SamplerConfig {
            sequence_lengths: vec![512, 128],
            tokens_per_batch: Some(2048),
            ..fixed.clone()
        };
        varlen.validate(None).unwrap();
        assert_eq!(
            varlen.train_shapes(),
            [StepShape { s: 512, b: 4 }, StepShape { s: 128, b: 16 }]
        );
        assert_eq!(varlen.fixed_shape(), StepShape { s: 256, b: 8 });
    }
}
