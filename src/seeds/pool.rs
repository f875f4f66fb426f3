//! The global seed pool of one (task, split): every rank's seeds, read in a
//! fresh keyed pseudo-random order each epoch.

use std::sync::Arc;

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
    /// With `seed_windows > 1`: this draw is the first of a window (the
    /// working set moves to another stretch of the pool).
    pub window_opened: bool,
}

/// The seeds of one (task, split) over all ranks, and the order they are
/// consumed in: absolute position `p` (counted from the start of epoch 0)
/// lies in epoch `p / len` and names seed `seeds[π_e(p % len)]`, where `π_e`
/// is a bijection of `0..len` keyed by (pool key, `e`). Nothing about the
/// order is stored: any position of any epoch is computed in O(1), so the
/// position counter alone is the pool's state.
#[derive(Debug, Clone)]
pub struct SeedPool {
    /// Shared with the sampler's list of the (task, split), made once.
    seeds: Arc<[u32]>,
    key: u64,
    /// The epoch whose permutation is cached, and that permutation.
    keyed_epoch: u64,
    order: Feistel,
    /// Independent check of "each seed once per epoch": one bit per seed
    /// index drawn through this instance in `checked_epoch`.
    checked_epoch: Option<u64>,
    drawn: Vec<u64>,
    /// Fault injection (`debug_repeat_seed_every`): every N-th draw through
    /// this instance returns the seed of the position before it in the same
    /// epoch; 0 = off.
    repeat_every: u64,
    draws: u64,
    /// Locality windows (1 = none): see [`SeedPool::with_windows`].
    windows: Windows,
}

/// The pool cut into `k` windows of `w` consecutive seeds (the last holds
/// `last`), and the keyed permutations of the current epoch that order them.
#[derive(Debug, Clone)]
struct Windows {
    k: u64,
    w: u64,
    last: u64,
    /// The epoch whose window order is cached, that order, and the rank in
    /// it of the short last window.
    epoch: Option<u64>,
    order: Feistel,
    short_rank: u64,
    /// The window whose inner permutation is cached (epoch, window).
    inner_of: Option<(u64, u64)>,
    inner: Feistel,
}

/// A keyed bijection of `0..n` for any `n`: a 4-round Feistel network over
/// `0..4^half >= n`, restricted to `0..n` by cycle walking.
#[derive(Debug, Clone, Copy, Default)]
struct Feistel {
    half: u32,
    keys: [u64; ROUNDS],
}

impl Feistel {
    fn new(n: u64, key: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let mut keys = [0; ROUNDS];
        for (j, k) in keys.iter_mut().enumerate() {
            *k = mix64(key ^ mix64(j as u64 + 1));
        }
        Feistel {
            half: bits.div_ceil(2).max(1),
            keys,
        }
    }

    #[inline]
    fn pass(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for &k in &self.keys {
            let f = mix64(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }

    #[inline]
    fn unpass(&self, y: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (y >> self.half, y & mask);
        for &k in self.keys.iter().rev() {
            let f = mix64(l ^ k) & mask;
            (l, r) = (r ^ f, l);
        }
        (l << self.half) | r
    }

    /// Image of `i < n`.
    #[inline]
    fn permute(&self, i: u64, n: u64) -> u64 {
        let mut x = self.pass(i);
        while x >= n {
            x = self.pass(x);
        }
        x
    }

    /// Preimage of `y < n`: walks the cycle backwards.
    fn invert(&self, y: u64, n: u64) -> u64 {
        let mut x = self.unpass(y);
        while x >= n {
            x = self.unpass(x);
        }
        x
    }
}

impl Windows {
    fn new(len: u64, k: u64) -> Self {
        let k = k.clamp(1, len.max(1));
        // At least 1, so an empty pool has one empty window.
        let w = len.div_ceil(k).max(1);
        // With w = ceil(len / k) the windows needed may be fewer than k.
        let k = len.div_ceil(w).max(1);
        Windows {
            k,
            w,
            last: len - (k - 1) * w,
            epoch: None,
            order: Feistel::default(),
            short_rank: 0,
            inner_of: None,
            inner: Feistel::default(),
        }
    }

    /// Index into the pool at in-epoch position `i` of `epoch`: the
    /// windows are read one after another in a keyed order, each in a keyed
    /// order of its own, so the epoch is still a permutation of the pool;
    /// and whether `i` is the first position of its window.
    fn index(&mut self, key: u64, epoch: u64, i: u64) -> (u64, bool) {
        if self.epoch != Some(epoch) {
            self.order = Feistel::new(self.k, mix64(key ^ mix64(epoch ^ 0x000D_3E5E_ED0F_0DE5)));
            self.short_rank = self.order.invert(self.k - 1, self.k);
            self.epoch = Some(epoch);
        }
        let short_start = self.short_rank * self.w;
        let (rank, j) = if i < short_start {
            (i / self.w, i % self.w)
        } else if i < short_start + self.last {
            (self.short_rank, i - short_start)
        } else {
            let after = i - short_start - self.last;
            (self.short_rank + 1 + after / self.w, after % self.w)
        };
        let win = self.order.permute(rank, self.k);
        let size = if win == self.k - 1 { self.last } else { self.w };
        if self.inner_of != Some((epoch, win)) {
            let wk = mix64(key ^ mix64(epoch.wrapping_mul(0x9E37_79B9) ^ mix64(win + 7)));
            self.inner = Feistel::new(size, wk);
            self.inner_of = Some((epoch, win));
        }
        (win * self.w + self.inner.permute(j, size), j == 0)
    }
}

impl SeedPool {
    /// `seeds`: positions in the task's seed list (the split's global
    /// pool, same on every rank); `key`: derived from (seed, split, task).
    pub fn new(seeds: Vec<u32>, key: u64) -> Self {
        Self::shared(seeds.into(), key)
    }

    /// [`new`](Self::new) over a list shared with others (the sampler's
    /// list of the (task, split), made once for every state that draws it).
    pub fn shared(seeds: Arc<[u32]>, key: u64) -> Self {
        let n = seeds.len() as u64;
        let mut p = SeedPool {
            drawn: vec![0; seeds.len().div_ceil(64)],
            seeds,
            key,
            keyed_epoch: 0,
            order: Feistel::default(),
            checked_epoch: None,
            repeat_every: 0,
            draws: 0,
            windows: Windows::new(n, 1),
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

    /// Locality (`seed_windows`): cut the pool into `k` windows of
    /// consecutive seeds (seeds are in the order of their rows, so a
    /// window's rows, and the rows its contexts reach through near keys, lie
    /// on few pages) and read each epoch window after window, in a keyed
    /// order of windows and a keyed order within each. Every epoch is still
    /// a permutation of the pool and any position is still computed in
    /// O(1) from (key, position); `k = 1` is the plain order, unchanged.
    #[must_use]
    pub fn with_windows(mut self, k: u64) -> Self {
        self.windows = Windows::new(self.seeds.len() as u64, k);
        self
    }

    /// Windows the pool is read in (1 = none).
    pub fn windows(&self) -> u64 {
        self.windows.k
    }

    /// Seeds per window (the last may hold fewer).
    pub fn window_len(&self) -> u64 {
        self.windows.w
    }

    fn key_epoch(&mut self, epoch: u64) {
        let e = mix64(self.key ^ mix64(epoch.wrapping_add(0x5851_F42D_4C95_7F2D)));
        self.order = Feistel::new(self.seeds.len() as u64, e);
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
        let at = if repeat { i - 1 } else { i };
        let (idx, window_opened) = if self.windows.k == 1 {
            (self.order.permute(at, self.seeds.len() as u64), false)
        } else {
            self.windows.index(self.key, epoch, at)
        };
        let idx = idx as usize;
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
            window_opened,
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
    fn windowed_epochs_are_permutations_read_window_after_window() {
        for (n, k) in [
            (1u32, 4u64),
            (10, 3),
            (37, 5),
            (100, 7),
            (1000, 16),
            (64, 64),
            (5, 9),
        ] {
            let mut p = SeedPool::new((0..n).collect(), 11).with_windows(k);
            let (k, w) = (p.windows(), p.window_len());
            assert!(
                k <= n as u64 && w * k >= n as u64 && w * (k - 1) < n as u64,
                "n={n}"
            );
            let mut orders = Vec::new();
            for epoch in 0..3u64 {
                let order: Vec<u32> = (0..n as u64)
                    .map(|i| {
                        let d = p.at(epoch * n as u64 + i);
                        assert!(!d.duplicate, "n={n} k={k}");
                        d.seed
                    })
                    .collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n} k={k}");
                // Window after window: the window changes k - 1 times.
                let changes = order
                    .windows(2)
                    .filter(|s| s[0] as u64 / w != s[1] as u64 / w);
                assert_eq!(changes.count() as u64, k - 1, "n={n} k={k}");
                // Each window's first draw says it opened one.
                let opened = (0..n as u64).filter(|&i| p.at(epoch * n as u64 + i).window_opened);
                assert_eq!(
                    opened.count() as u64,
                    if k > 1 { k } else { 0 },
                    "n={n} k={k}"
                );
                orders.push(order);
            }
            if n >= 37 {
                assert_ne!(orders[0], orders[1], "n={n}: epochs in the same order");
            }
            let mut q = SeedPool::new((0..n).collect(), 11).with_windows(k);
            assert_eq!(
                q.at(2 * n as u64 + n as u64 / 2).seed,
                orders[2][n as usize / 2]
            );
        }
        // An empty pool has one empty window.
        assert_eq!(SeedPool::new(Vec::new(), 3).with_windows(8).windows(), 1);
        // One window is the plain order.
        let mut a = SeedPool::new((0..500).collect(), 3);
        let mut b = SeedPool::new((0..500).collect(), 3).with_windows(1);
        assert!((0..1500).all(|i| a.at(i) == b.at(i)));
    }

    #[test]
    fn feistel_inverts() {
        for n in [1u64, 2, 3, 17, 1000] {
            let f = Feistel::new(n, 99);
            for i in 0..n {
                assert_eq!(f.invert(f.permute(i, n), n), i);
            }
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
