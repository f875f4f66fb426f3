//! The `expected` example ranker: the visit counts `num_walks` random
//! walks are expected to give, computed without drawing a walk.
//!
//! A walk of `walk_length` rows from the seed is a Markov chain: at each
//! row it moves to a uniformly random neighbour among the row's parents
//! and its children visible at the seed's cutoff, and ends at a row with
//! none (`super::walks`). So the probability of being at each row after
//! `t` steps is the previous step's probabilities, each row's share split
//! evenly over its neighbours; summed over the `walk_length` rows a walk
//! visits, a row's probability is its expected visits per walk. Times
//! `num_walks`, rounded, these are the counts [`WalkCounts::ranked`] orders
//! (the `walks` ranker's order on the counts the walks converge to,
//! without their sampling noise: two runs of `walks` agree with each other
//! less than either agrees with this).
//!
//! Pruning: a row whose share per neighbour is below [`PRUNE`] of one
//! expected visit of `num_walks` walks does not spread it (its mass is
//! dropped, so expected visits are never overstated). A step's work is
//! then at most `num_walks / PRUNE` neighbour updates (each spreading row
//! gives each neighbour at least that share of a total of at most 1), and
//! in practice far fewer: mass reaching a hub stops there.
//!
//! Hot-path invariants: no allocation per context after warm-up (dense
//! probability arrays over the database's rows, reused per worker and
//! cleared through the lists of rows they hold); no random draw.

use std::time::Instant;

use super::walk_graph::HEAD;
use super::walks::{WalkCounts, WalkGraph, WalkParams};
use crate::prefetch::prefetch;

/// A row spreads its probability only when each neighbour's share is at
/// least this fraction of one expected visit of `num_walks` walks.
pub const PRUNE: f32 = 0.25;

/// Records prefetched ahead of the one being spread.
const AHEAD: usize = 8;

/// Per-worker scratch of the `expected` ranker.
#[derive(Debug, Default)]
pub struct Spread {
    /// Probability of being at each record at the current step, by record
    /// offset / [`HEAD`] (a record is at least `HEAD` words: one slot
    /// each, and no second read to turn a neighbour's record into a row).
    cur: Vec<f32>,
    /// The same for the next step.
    next: Vec<f32>,
    /// Record offsets with probability at the current step.
    cur_at: Vec<u32>,
    /// The same for the next step: the first `n_next` (written ahead of
    /// the count so that a first touch is not a branch).
    next_at: Vec<u32>,
    n_next: usize,
    /// Expected visits per walk of the rows of the seed's table.
    visits: Vec<f32>,
    /// Rows of the seed's table with expected visits (global rows).
    visited: Vec<u32>,
    /// `(record offset + 1, cutoff rank, visible children)` of hubs,
    /// direct-mapped by record offset (kept across contexts: the rank is
    /// part of the tag).
    hubs: Vec<(u32, u32, u32)>,
}

/// Slots of [`Spread`]'s visible-children cache.
const HUB_SLOTS: usize = 1 << 14;

/// Records with at least this many children keep their visible count in
/// the cache (a search over fewer reads the record's first lines anyway).
const HUB_DEGREE: u32 = 16;

impl Spread {
    /// Set `counts` to the expected visits of `p.num_walks` walks from
    /// `seed` (rounded; rows expected less than half a visit are not
    /// counted). Returns the neighbour updates made, or `Err(updates)`
    /// when `deadline` passed first (read once per step).
    pub fn expected(
        &mut self,
        wg: &WalkGraph,
        seed: u32,
        p: &WalkParams,
        counts: &mut WalkCounts,
        deadline: Option<Instant>,
    ) -> Result<u64, u64> {
        counts.reset(p.table);
        let slots = wg.words.len() / HEAD + 1;
        if self.cur.len() < slots {
            self.cur.resize(slots, 0.0);
            self.next.resize(slots, 0.0);
        }
        let (lo, hi) = p.table;
        if self.visits.len() < (hi - lo) as usize {
            self.visits.resize((hi - lo) as usize, 0.0);
        }
        let Some(&start) = wg.at.get(seed as usize) else {
            return Ok(0);
        };
        if p.walk_length == 0 || p.num_walks == 0 {
            return Ok(0);
        }
        let crank = wg.visible_rank(p.cutoff);
        let floor = PRUNE / p.num_walks as f32;
        self.cur_at.push(start);
        self.cur[start as usize / HEAD] = 1.0;
        let mut updates = 0u64;
        let mut result = Ok(());
        for t in 0..p.walk_length {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                result = Err(());
                break;
            }
            let last = t + 1 == p.walk_length;
            updates += self.step(wg, crank, floor, (lo, hi), last);
            self.next_at.truncate(self.n_next);
            self.n_next = 0;
            std::mem::swap(&mut self.cur, &mut self.next);
            std::mem::swap(&mut self.cur_at, &mut self.next_at);
            if self.cur_at.is_empty() {
                break;
            }
        }
        for &o in &self.cur_at {
            self.cur[o as usize / HEAD] = 0.0;
        }
        self.n_next = 0;
        self.cur_at.clear();
        let scale = p.num_walks as f32;
        for &r in &self.visited {
            let v = std::mem::take(&mut self.visits[(r - lo) as usize]);
            let c = (v * scale).round();
            if c >= 1.0 {
                counts.set(r, c.min(u32::MAX as f32) as u32);
            }
        }
        self.visited.clear();
        result.map(|()| updates).map_err(|()| updates)
    }

    /// One step: count the current records' visits, spread their
    /// probability into `next` (unless `last`), clear them. Returns the
    /// updates made.
    fn step(
        &mut self,
        wg: &WalkGraph,
        crank: u32,
        floor: f32,
        table: (u32, u32),
        last: bool,
    ) -> u64 {
        let w = &wg.words;
        let mut updates = 0u64;
        for i in 0..self.cur_at.len() {
            if let Some(&a) = self.cur_at.get(i + 2 * AHEAD) {
                prefetch(w, a as usize);
            }
            if let Some(&a) = self.cur_at.get(i + AHEAD) {
                self.prefetch_neighbours(w, a as usize);
            }
            let o = self.cur_at[i] as usize;
            let m = std::mem::take(&mut self.cur[o / HEAD]);
            let r = w[o];
            if (table.0..table.1).contains(&r) {
                let v = &mut self.visits[(r - table.0) as usize];
                if *v == 0.0 {
                    self.visited.push(r);
                }
                *v += m;
            }
            if last {
                continue;
            }
            let np = w[o + 1] as usize;
            let nc = if w[o + 3] < crank {
                w[o + 2] as usize
            } else {
                self.visible(wg, o, crank) as usize
            };
            let d = np + nc;
            let share = m / d.max(1) as f32;
            if d == 0 || share < floor {
                continue;
            }
            updates += d as u64;
            if self.next_at.len() < self.n_next + d {
                self.next_at.resize(self.n_next + d, 0);
            }
            let first = o + HEAD;
            for &rec in &w[first..first + np] {
                self.add(rec, share);
            }
            for k in 0..nc {
                self.add(w[first + np + 2 * k], share);
            }
        }
        self.cur_at.clear();
        updates
    }

    /// Add `share` to the probability of the record at `rec` at the next
    /// step (the dead record that a corrupt payload's out-of-range row id
    /// leads to has no neighbour: the walk's share ends there).
    /// The children of the record at `o` visible below `crank` (a hub's
    /// from the cache after its first search).
    fn visible(&mut self, wg: &WalkGraph, o: usize, crank: u32) -> u32 {
        if wg.words[o + 2] < HUB_DEGREE {
            return wg.visible_children(o, crank);
        }
        if self.hubs.len() != HUB_SLOTS {
            self.hubs = vec![(0, 0, 0); HUB_SLOTS];
        }
        let tag = o as u32 + 1;
        let slot = &mut self.hubs[(tag as usize).wrapping_mul(0x9E37_79B9) >> 18 & (HUB_SLOTS - 1)];
        if slot.0 != tag || slot.1 != crank {
            *slot = (tag, crank, wg.visible_children(o, crank));
        }
        slot.2
    }

    /// Room for the neighbour in `next_at` is the caller's.
    #[inline]
    fn add(&mut self, rec: u32, share: f32) {
        let x = &mut self.next[rec as usize / HEAD];
        self.next_at[self.n_next] = rec;
        self.n_next += usize::from(*x == 0.0);
        *x += share;
    }

    /// Prefetch the next-step probabilities of the first neighbours of
    /// the record at `o` (read a few records before it spreads).
    #[inline]
    fn prefetch_neighbours(&self, w: &[u32], o: usize) {
        let np = w[o + 1] as usize;
        let first = o + HEAD;
        for &rec in w[first..first + np].iter().take(4) {
            prefetch(&self.next, rec as usize / HEAD);
        }
        let nc = (w[o + 2] as usize).min(4);
        for k in 0..nc {
            prefetch(&self.next, w[first + np + 2 * k] as usize / HEAD);
        }
    }
}
