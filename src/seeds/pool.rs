//! A rank's shuffled pool of seeds for one (task, split).

use crate::rng::Xoshiro256pp;

/// One draw from a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// Position in the task's seed list.
    pub seed: u32,
    /// The pool ran out and reshuffled before this draw (a new epoch began).
    pub exhausted: bool,
    /// This seed was already drawn in the current epoch (must never happen).
    pub duplicate: bool,
}

/// Shuffled seeds with a cursor; reshuffles when exhausted.
#[derive(Debug, Clone)]
pub struct SeedPool {
    order: Vec<u32>,
    cursor: usize,
    epoch: u64,
    rng: Xoshiro256pp,
    /// Independent check of "each seed once per epoch": one bit per seed
    /// position in `order`'s value space, cleared at each reshuffle.
    drawn: Vec<u64>,
    /// Map from seed value to a dense bit index.
    base: Vec<u32>,
    /// Fault injection (`debug_repeat_seed_every`): every N-th draw repeats
    /// the previous seed of the epoch; 0 = off.
    repeat_every: u64,
    draws: u64,
}

impl SeedPool {
    /// A pool over `seeds`, shuffled with a generator seeded by `rng_seed`.
    pub fn new(seeds: Vec<u32>, rng_seed: u64) -> Self {
        let mut base = seeds.clone();
        base.sort_unstable();
        let mut p = SeedPool {
            drawn: vec![0; seeds.len().div_ceil(64)],
            order: seeds,
            cursor: 0,
            epoch: 0,
            rng: Xoshiro256pp::seed_from_u64(rng_seed),
            base,
            repeat_every: 0,
            draws: 0,
        };
        p.shuffle();
        p
    }

    /// Fault injection: every `n`-th draw (0 = never) returns the seed drawn
    /// just before it in the same epoch instead of advancing, so the
    /// independent once-per-epoch check must count a duplicate.
    #[must_use]
    pub fn with_repeat_fault(mut self, n: u64) -> Self {
        self.repeat_every = n;
        self
    }

    fn shuffle(&mut self) {
        let n = self.order.len();
        for i in (1..n).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            self.order.swap(i, j);
        }
        self.cursor = 0;
        self.drawn.iter_mut().for_each(|w| *w = 0);
    }

    /// Seeds in the pool.
    pub fn len(&self) -> usize {
        self.order.len()
    }
    /// The pool has no seeds.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
    /// Seeds left before the next reshuffle.
    pub fn remaining(&self) -> usize {
        self.order.len() - self.cursor
    }
    /// Reshuffles so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Draw the next seed. The pool must not be empty.
    pub fn draw(&mut self) -> Draw {
        debug_assert!(!self.order.is_empty());
        let mut exhausted = false;
        if self.cursor == self.order.len() {
            self.epoch += 1;
            self.shuffle();
            exhausted = true;
        }
        self.draws += 1;
        let repeat = self.repeat_every > 0 && self.draws % self.repeat_every == 0;
        let seed = if repeat && self.cursor > 0 {
            self.order[self.cursor - 1]
        } else {
            self.cursor += 1;
            self.order[self.cursor - 1]
        };
        let bit = self.base.binary_search(&seed).unwrap_or(0);
        let (w, b) = (bit / 64, 1u64 << (bit % 64));
        let duplicate = self.drawn[w] & b != 0;
        self.drawn[w] |= b;
        Draw {
            seed,
            exhausted,
            duplicate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_seed_once_per_epoch_and_exhaust_events() {
        let mut p = SeedPool::new((100..137).collect(), 5);
        for epoch in 0..4 {
            let mut got: Vec<u32> = (0..37)
                .map(|i| {
                    let d = p.draw();
                    assert_eq!(d.exhausted, epoch > 0 && i == 0);
                    assert!(!d.duplicate);
                    d.seed
                })
                .collect();
            assert_eq!(p.remaining(), 0);
            got.sort_unstable();
            assert_eq!(got, (100..137).collect::<Vec<_>>());
        }
        assert_eq!(p.epoch(), 3);
    }

    #[test]
    fn the_repeat_fault_is_caught_as_a_duplicate() {
        let mut p = SeedPool::new((0..50).collect(), 1).with_repeat_fault(5);
        let draws: Vec<Draw> = (0..20).map(|_| p.draw()).collect();
        let dups: Vec<usize> = (0..20).filter(|&i| draws[i].duplicate).collect();
        assert_eq!(dups, vec![4, 9, 14, 19]);
        for &i in &dups {
            assert_eq!(draws[i].seed, draws[i - 1].seed);
        }
    }
}
