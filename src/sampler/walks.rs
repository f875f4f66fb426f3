//! The `walks` example ranker: visit counts of random walks from the seed
//! over the FK graph (RT-J's semantics), and the order they give the rows
//! of the seed's table.
//!
//! A walk starts at the seed and visits `walk_length` rows: at each row it
//! steps to a uniformly random neighbour among the row's parents and its
//! children visible at the seed's cutoff (time-sorted CSR: a prefix), and
//! stops early at a row without one. A visit counts for a row of the seed's
//! table other than the seed whose time is before the seed's bound (or that
//! has no time).
//!
//! Hot-path invariants: no allocation per walk or per context after
//! warm-up — the counts are a dense array over the seed table's rows,
//! reused per worker and zeroed through the list of rows it touched; a
//! step reads two CSR offsets pairs, at most one binary search (skipped
//! when every child is visible) and one target.

use std::time::Instant;

use crate::format::GraphView;
use crate::rng::{mix64, Xoshiro256pp};

/// Walks between two reads of the clock for the deadline.
const WALKS_PER_CLOCK: usize = 64;

/// Per-worker walk state: visit counts over the rows of one table.
#[derive(Debug, Default)]
pub struct WalkCounts {
    /// Visits per row of the table (`row - lo`); zero outside `touched`.
    counts: Vec<u32>,
    /// Rows (global ids) with a count above zero, in first-visit order.
    pub touched: Vec<u32>,
    /// First global row of the counted table.
    lo: u32,
}

/// What one context's walks read.
#[derive(Debug, Clone, Copy)]
pub struct WalkParams {
    /// Walks from the seed.
    pub num_walks: usize,
    /// Rows each walk visits (the seed first).
    pub walk_length: usize,
    /// Children dated after this are invisible (the seed's cutoff).
    pub cutoff: i64,
    /// A visited row counts only if its time is below this (or it has none).
    pub bound: i64,
    /// Global row range `[lo, hi)` of the seed's table.
    pub table: (u32, u32),
}

impl WalkCounts {
    /// Forget the previous context's counts and count over `table`.
    fn reset(&mut self, table: (u32, u32)) {
        for &r in &self.touched {
            if let Some(c) = self.counts.get_mut((r - self.lo) as usize) {
                *c = 0;
            }
        }
        self.touched.clear();
        self.lo = table.0;
        let n = (table.1 - table.0) as usize;
        if self.counts.len() < n {
            self.counts.resize(n, 0);
        }
    }

    /// Visits of `row` (0 for a row outside the counted table).
    #[inline]
    pub fn get(&self, row: u32) -> u32 {
        row.checked_sub(self.lo)
            .and_then(|i| self.counts.get(i as usize))
            .copied()
            .unwrap_or(0)
    }

    /// Run `p.num_walks` walks from `seed` and count their visits. Returns
    /// the steps taken, or `Err(steps)` when `deadline` passed first.
    pub fn walk(
        &mut self,
        g: &GraphView<'_>,
        seed: u32,
        p: &WalkParams,
        rng: &mut Xoshiro256pp,
        deadline: Option<Instant>,
    ) -> Result<u64, u64> {
        self.reset(p.table);
        let (lo, hi) = p.table;
        let mut steps = 0u64;
        for w in 0..p.num_walks {
            if w % WALKS_PER_CLOCK == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(steps);
            }
            let mut u = seed;
            for i in 0..p.walk_length {
                if u != seed && lo <= u && u < hi {
                    let t = g.row_time.get(u as usize).copied().unwrap_or(i64::MIN);
                    if t == i64::MIN || t < p.bound {
                        let c = &mut self.counts[(u - lo) as usize];
                        if *c == 0 {
                            self.touched.push(u);
                        }
                        *c += 1;
                    }
                }
                if i + 1 == p.walk_length {
                    break;
                }
                match step(g, u, p.cutoff, rng) {
                    Some(v) => u = v,
                    None => break,
                }
                steps += 1;
            }
        }
        Ok(steps)
    }

    /// The touched rows that `keep` accepts, best first: by visits (more
    /// first) or, with `prefer_latest`, by time (latest first, a row
    /// without time last) then visits; ties by a hash of `key` and the row,
    /// so equal rows are in a random but deterministic order.
    pub fn ranked(
        &self,
        g: &GraphView<'_>,
        prefer_latest: bool,
        key: u64,
        keep: impl Fn(u32) -> bool,
        out: &mut Vec<u32>,
    ) {
        out.clear();
        out.extend(self.touched.iter().copied().filter(|&r| keep(r)));
        let prio = |r: u32| mix64(key ^ u64::from(r).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let time = |r: u32| g.row_time.get(r as usize).copied().unwrap_or(i64::MIN);
        if prefer_latest {
            out.sort_unstable_by(|&a, &b| {
                time(b)
                    .cmp(&time(a))
                    .then(self.get(b).cmp(&self.get(a)))
                    .then(prio(a).cmp(&prio(b)))
                    .then(a.cmp(&b))
            });
        } else {
            out.sort_unstable_by(|&a, &b| {
                self.get(b)
                    .cmp(&self.get(a))
                    .then(prio(a).cmp(&prio(b)))
                    .then(a.cmp(&b))
            });
        }
    }
}

/// One walk step from `u`: a uniform neighbour among its parents and its
/// children visible at `cutoff`; `None` when it has none (or its CSR
/// offsets are out of range: a corrupt payload ends the walk).
#[inline]
fn step(g: &GraphView<'_>, u: u32, cutoff: i64, rng: &mut Xoshiro256pp) -> Option<u32> {
    let r = u as usize;
    let (pa, pb) = (
        *g.fwd_offsets.get(r)? as usize,
        *g.fwd_offsets.get(r + 1)? as usize,
    );
    let (ca, cb) = (
        *g.rev_offsets.get(r)? as usize,
        *g.rev_offsets.get(r + 1)? as usize,
    );
    let np = pb.saturating_sub(pa);
    let times = g.rev_times.get(ca..cb).unwrap_or(&[]);
    let nc = match times.last() {
        Some(&t) if t > cutoff => times.partition_point(|&t| t <= cutoff),
        _ => times.len(),
    };
    let n = np + nc;
    if n == 0 {
        return None;
    }
    let k = rng.below(n as u64) as usize;
    if k < np {
        g.fwd_targets.get(pa + k).copied()
    } else {
        g.rev_targets.get(ca + k - np).copied()
    }
}
