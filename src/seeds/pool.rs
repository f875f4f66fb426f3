//! The global seed pool of one (task, split): every rank's seeds, read in a
//! fresh keyed pseudo-random order each epoch.

use crate::rng::mix64;

/// Feistel rounds of the per-epoch permutation (a 4-round Feistel network
/// with a strong round function is a pseudo-random permutation).
const ROUNDS: usize = 4;

/// One draw from a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// Position in the task's seed list.
    pub seed: u32,
    /// This draw opened a new epoch (the pool ran out before it and was
    /// "reshuffled"): an exhaust event.
    pub exhausted: bool,
    /// This seed was already drawn in the current epoch by this pool
    /// instance (must never happen).
    pub duplicate: bool,
}

/// The seeds of one (task, split) over all ranks, and the order they are
/// consumed in: absolute position `p` (counted from the start of epoch 0)
/// lies in epoch `p / len` and names seed `seeds[π_e(p % len)]`, where `π_e`
/// is a bijection of `0..len` keyed by (pool key, `e`). Nothing about the
/// order is stored: any position of any epoch is computed in O(1), so the
/// position counter alone is the pool's state.
#[derive(Debug, Clone)]
pub struct SeedPool {
    seeds: Vec<u32>,
    key: u64,
    /// Half-width in bits of the Feistel domain `0..4^half >= len`.
    half: u32,
    /// The epoch whose round keys are cached.
    keyed_epoch: u64,
    round_keys: [u64; ROUNDS],
    /// Independent check of "each seed once per epoch": one bit per seed
    /// index drawn through this instance in `checked_epoch`.
    checked_epoch: Option<u64>,
    drawn: Vec<u64>,
    /// Fault injection (`debug_repeat_seed_every`): every N-th draw through
    /// this instance returns the seed of the position before it in the same
    /// epoch; 0 = off.
    repeat_every: u64,
    draws: u64,
}

impl SeedPool {
    /// `seeds`: positions in the task's seed list (the split's global
    /// pool, same on every rank); `key`: derived from (seed, split, task).
    pub fn new(seeds: Vec<u32>, key: u64) -> Self {
        let n = seeds.len() as u64;
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half = bits.div_ceil(2).max(1);
        let mut p = SeedPool {
            drawn: vec![0; seeds.len().div_ceil(64)],
            seeds,
            key,
            half,
            keyed_epoch: 0,
            round_keys: [0; ROUNDS],
            checked_epoch: None,
            repeat_every: 0,
            draws: 0,
        };
        p.key_epoch(0);
        p
    }

    /// Fault injection: every `n`-th draw (0 = never) returns the seed of
    /// the previous position of the same epoch instead of its own, so the
    /// independent once-per-epoch check must count a duplicate.
    #[must_use]
    pub fn with_repeat_fault(mut self, n: u64) -> Self {
        self.repeat_every = n;
        self
    }

    fn key_epoch(&mut self, epoch: u64) {
        let e = mix64(self.key ^ mix64(epoch.wrapping_add(0x5851_F42D_4C95_7F2D)));
        for (j, k) in self.round_keys.iter_mut().enumerate() {
            *k = mix64(e ^ mix64(j as u64 + 1));
        }
        self.keyed_epoch = epoch;
    }

    /// Seeds in the pool.
    pub fn len(&self) -> usize {
        self.seeds.len()
    }
    /// The pool has no seeds.
    pub fn is_empty(&self) -> bool {
        self.seeds.is_empty()
    }
    /// The pool's seeds (positions in the task's seed list), ascending.
    pub fn seeds(&self) -> &[u32] {
        &self.seeds
    }

    /// One Feistel pass over the `4^half` domain.
    #[inline]
    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for &k in &self.round_keys {
            let f = mix64(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }

    /// Index (into the pool) at position `i` of the current keyed epoch:
    /// the Feistel permutation restricted to `0..len` by cycle walking.
    #[inline]
    fn permute(&self, i: u64) -> u64 {
        let n = self.seeds.len() as u64;
        let mut x = self.feistel(i);
        while x >= n {
            x = self.feistel(x);
        }
        x
    }

    /// The seed at absolute position `p` (`p / len` is its epoch). The pool
    /// must not be empty.
    pub fn at(&mut self, p: u64) -> Draw {
        debug_assert!(!self.seeds.is_empty());
        let n = self.seeds.len() as u64;
        let (epoch, i) = (p / n, p % n);
        if epoch != self.keyed_epoch {
            self.key_epoch(epoch);
        }
        self.draws += 1;
        let repeat = self.repeat_every > 0 && self.draws % self.repeat_every == 0 && i > 0;
        let idx = self.permute(if repeat { i - 1 } else { i }) as usize;
        if self.checked_epoch != Some(epoch) {
            self.drawn.iter_mut().for_each(|w| *w = 0);
            self.checked_epoch = Some(epoch);
        }
        let (w, b) = (idx / 64, 1u64 << (idx % 64));
        let duplicate = self.drawn[w] & b != 0;
        self.drawn[w] |= b;
        Draw {
            seed: self.seeds[idx],
            exhausted: p > 0 && i == 0,
            duplicate,
        }
    }
}

/// Epoch and in-epoch cursor after `drawn` positions of a pool of `len`
/// (`len > 0`). The cursor is in `1..=len` once anything was drawn: a pool
/// whose cursor is `len` is exhausted and opens its next epoch (an exhaust
/// event) at the next draw, as a lazily reshuffled pool would.
pub fn epoch_cursor(drawn: u64, len: u64) -> (u64, u64) {
    if drawn == 0 {
        (0, 0)
    } else {
        let e = (drawn - 1) / len;
        (e, drawn - e * len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_epoch_is_a_permutation_and_epochs_differ() {
        for n in [1usize, 2, 3, 5, 37, 64, 65, 1000] {
            let mut p = SeedPool::new((100..100 + n as u32).collect(), 5);
            let mut orders = Vec::new();
            for epoch in 0..4u64 {
                let order: Vec<u32> = (0..n as u64)
                    .map(|i| {
                        let d = p.at(epoch * n as u64 + i);
                        assert_eq!(d.exhausted, epoch > 0 && i == 0);
                        assert!(!d.duplicate);
                        d.seed
                    })
                    .collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (100..100 + n as u32).collect::<Vec<_>>(), "n={n}");
                orders.push(order);
            }
            if n >= 5 {
                assert_ne!(
                    orders[0], orders[1],
                    "n={n}: epochs 0 and 1 in the same order"
                );
            }
            // Random access gives the same seed as sequential access.
            let mut q = SeedPool::new((100..100 + n as u32).collect(), 5);
            assert_eq!(q.at(2 * n as u64 + n as u64 / 2).seed, orders[2][n / 2]);
        }
    }

    #[test]
    fn a_repeat_within_an_epoch_is_flagged() {
        let mut p = SeedPool::new((0..10).collect(), 1);
        assert!(!p.at(3).duplicate);
        assert!(p.at(3).duplicate, "the same position twice in one epoch");
        assert!(!p.at(13).duplicate, "a new epoch clears the check");
    }

    #[test]
    fn the_repeat_fault_is_caught_as_a_duplicate() {
        let mut p = SeedPool::new((0..50).collect(), 1).with_repeat_fault(5);
        let draws: Vec<Draw> = (0..20).map(|i| p.at(i)).collect();
        let dups: Vec<usize> = (0..20).filter(|&i| draws[i].duplicate).collect();
        assert_eq!(dups, vec![4, 9, 14, 19]);
        for &i in &dups {
            assert_eq!(draws[i].seed, draws[i - 1].seed);
        }
    }

    #[test]
    fn epoch_cursor_is_lazy_at_boundaries() {
        assert_eq!(epoch_cursor(0, 4), (0, 0));
        assert_eq!(epoch_cursor(3, 4), (0, 3));
        assert_eq!(epoch_cursor(4, 4), (0, 4));
        assert_eq!(epoch_cursor(5, 4), (1, 1));
        assert_eq!(epoch_cursor(12, 4), (2, 4));
    }
}
