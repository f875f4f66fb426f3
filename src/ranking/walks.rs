//! The `walks` example ranker: visit counts of random walks from the seed
//! over the FK graph (RT-J's semantics), and the order they give the rows
//! of the seed's table.
//!
//! A walk starts at the seed and visits `walk_length` rows: at each row it
//! steps to a uniformly random neighbour among the row's parents and its
//! children visible at the seed's cutoff (time-sorted: a prefix), and stops
//! early at a row without one. A visit counts for a row of the seed's
//! table other than the seed whose time is before the seed's bound (or
//! that has no time): every visit of a row of the table is counted, and
//! [`WalkCounts::ranked`] drops the seed and the rows past the bound.
//!
//! Hot-path invariants: no allocation per walk or per context after
//! warm-up — the counts are a dense array over the seed table's rows,
//! reused per worker and zeroed through the list of rows it touched; a
//! step reads one record of the walk graph (its row and how many
//! neighbours it has, prefetched a round earlier) and one neighbour slot
//! (the next record's offset and, for a child, its time rank beside it,
//! prefetched half a round earlier), so a walk chases records, never a row
//! id through a second array. When some child of a row is after the
//! cutoff, the step draws over all its neighbours and redraws over the
//! visible ones (a prefix: a binary search, cached per hub) only when it
//! drew an invisible child: still uniform over the visible neighbours.
//! A record is read only once [`WalkGraph::record_ok`] accepted it (its
//! blocks of a mapped graph checked: one load once all are); a refused
//! one ends the walk, and its failure fails the batch.

use std::cmp::Reverse;
use std::time::Instant;

pub use super::walk_graph::WalkGraph;
use super::walk_graph::{HubCache, HEAD};
use crate::format::GraphView;
use crate::prefetch::prefetch;
use crate::rng::{mix64, Xoshiro256pp};

/// Walks between two reads of the clock for the deadline.
pub const WALKS_PER_CLOCK: usize = 64;

/// Walks advanced in lockstep, one step each per round, so that a walk's
/// next record is prefetched a whole round before it is read.
pub const LANES: usize = 64;

/// Prefetch the first two lines of the record at `o` (a record's head
/// and first neighbours; most records of a database fit).
#[inline]
fn prefetch_record(w: &[u32], o: usize) {
    prefetch(w, o);
    prefetch(w, o + 16);
}

/// Per-worker walk state: visit counts over the rows of one table.
#[derive(Debug, Default)]
pub struct WalkCounts {
    /// Visits per row of the table (`row - lo`); zero outside `touched`.
    counts: Vec<u32>,
    /// Rows (global ids) with a count above zero, in first-visit order.
    pub touched: Vec<u32>,
    /// First global row of the counted table.
    lo: u32,
    /// Rows of the counted table.
    len: u32,
    /// Visible children of hubs.
    cache: HubCache,
    /// Visits noted and not counted yet (`row - lo`): `noted` of them.
    pending: Vec<u32>,
    noted: usize,
    /// Scratch of [`ranked`](Self::ranked): touched rows with their keys.
    keyed: Vec<(Reverse<i64>, Reverse<u32>, u64, u32)>,
}

/// Visits noted before they are counted.
const PENDING: usize = 4096;

/// A lane's slot when its walk ends this round.
const NO_SLOT: u32 = u32::MAX;

/// The walks in flight of one [`WalkCounts::more`] call.
struct Lanes {
    /// The record each lane is at.
    at: [u32; LANES],
    /// The slot of each lane's next row (drawn, prefetched), or [`NO_SLOT`].
    slot: [u32; LANES],
    /// Rows each lane's walk still visits, this one included.
    left: [u32; LANES],
    /// Lanes `0..active` hold walks.
    active: usize,
    /// Walks started by this call.
    started: usize,
    /// Steps taken.
    steps: u64,
}

impl Lanes {
    /// Whether the deadline has passed, read every [`WALKS_PER_CLOCK`]
    /// walk starts (`done` walks were run before this call).
    fn clock(&self, done: usize, deadline: Option<Instant>) -> bool {
        (done + self.started) % WALKS_PER_CLOCK == 0
            && deadline.is_some_and(|d| Instant::now() >= d)
    }
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
    pub fn reset(&mut self, table: (u32, u32)) {
        for &r in &self.touched {
            if let Some(c) = self.counts.get_mut(r.wrapping_sub(self.lo) as usize) {
                *c = 0;
            }
        }
        self.touched.clear();
        self.lo = table.0;
        self.len = table.1.saturating_sub(table.0);
        if self.counts.len() < self.len as usize {
            self.counts.resize(self.len as usize, 0);
        }
    }

    /// Visits of `row` (0 for a row outside the counted table).
    #[inline]
    pub fn get(&self, row: u32) -> u32 {
        let i = row.wrapping_sub(self.lo);
        if i < self.len {
            self.counts[i as usize]
        } else {
            0
        }
    }

    /// Set the visits of `row` (a row of the counted table, not set yet
    /// since the last [`reset`](Self::reset)): the `expected` ranker's
    /// counts.
    pub fn set(&mut self, row: u32, visits: u32) {
        let i = row.wrapping_sub(self.lo);
        if i < self.len && visits > 0 {
            if self.counts[i as usize] == 0 {
                self.touched.push(row);
            }
            self.counts[i as usize] = visits;
        }
    }

    /// Note a visit of `row` (counted at the next [`flush`](Self::flush)):
    /// the visits of a round are counted together, so their scattered
    /// increments overlap instead of each stalling its walk's step.
    #[inline]
    fn note(&mut self, row: u32) {
        let i = row.wrapping_sub(self.lo);
        self.pending[self.noted] = i;
        self.noted += usize::from(i < self.len);
    }

    /// Count the noted visits.
    fn flush(&mut self) {
        for &i in &self.pending[..self.noted] {
            let c = &mut self.counts[i as usize];
            if *c == 0 {
                self.touched.push(i + self.lo);
            }
            *c += 1;
        }
        self.noted = 0;
    }

    /// Forget the counts, then run `p.num_walks` walks from `seed` over
    /// `wg` and count their visits. Returns the steps taken, or
    /// `Err(steps)` when `deadline` passed first (read every
    /// [`WALKS_PER_CLOCK`] walk starts).
    pub fn walk(
        &mut self,
        wg: &WalkGraph,
        seed: u32,
        p: &WalkParams,
        rng: &mut Xoshiro256pp,
        deadline: Option<Instant>,
    ) -> Result<u64, u64> {
        self.reset(p.table);
        self.more(wg, seed, p, p.num_walks, 0, rng, deadline)
    }

    /// `n` more walks from `seed`, their visits added to the counts (the
    /// counted table is the last [`reset`](Self::reset)'s); `done` walks
    /// were run before (for the clock's rhythm).
    ///
    /// [`LANES`] walks advance in lockstep, one step each per round: a
    /// step reads its record (prefetched when the walk moved there, a
    /// round earlier), counts its row, draws the next neighbour and
    /// prefetches that record. The lanes draw from one generator in a
    /// fixed order, one draw per step: the counts are a function of the
    /// seed and the generator, never of timing.
    #[allow(clippy::too_many_arguments)]
    pub fn more(
        &mut self,
        wg: &WalkGraph,
        seed: u32,
        p: &WalkParams,
        n: usize,
        done: usize,
        rng: &mut Xoshiro256pp,
        deadline: Option<Instant>,
    ) -> Result<u64, u64> {
        let Some(start) = wg.start_of(seed).map(|o| o as u32) else {
            return Ok(0);
        };
        if p.walk_length == 0 {
            return Ok(0);
        }
        let crank = wg.visible_rank(p.cutoff);
        if self.pending.len() < PENDING {
            self.pending.resize(PENDING, 0);
        }
        let mut l = Lanes {
            at: [start; LANES],
            slot: [NO_SLOT; LANES],
            left: [u32::try_from(p.walk_length).unwrap_or(u32::MAX); LANES],
            active: 0,
            started: 0,
            steps: 0,
        };
        while l.active < n.min(LANES) {
            if l.clock(done, deadline) {
                self.flush();
                return Err(l.steps);
            }
            l.active += 1;
            l.started += 1;
        }
        while l.active > 0 {
            // Half a round: note each lane's row and draw its next slot.
            if self.noted + LANES > self.pending.len() {
                self.flush();
            }
            for i in 0..l.active {
                l.slot[i] = self.draw(wg, l.at[i] as usize, &mut l.left[i], rng);
            }
            // The other half: read each slot, prefetch the record it names;
            // a lane whose walk ended starts the next one or retires.
            let mut i = 0;
            while i < l.active {
                let s = l.slot[i];
                if s != NO_SLOT {
                    let next = self.read(wg, l.at[i] as usize, s, crank, rng);
                    if next != NO_SLOT {
                        prefetch_record(wg.words(), next as usize);
                        l.at[i] = next;
                        l.steps += 1;
                        i += 1;
                        continue;
                    }
                }
                if l.started < n {
                    if l.clock(done, deadline) {
                        self.flush();
                        return Err(l.steps);
                    }
                    l.started += 1;
                    l.at[i] = start;
                    l.left[i] = u32::try_from(p.walk_length).unwrap_or(u32::MAX);
                    i += 1;
                } else {
                    l.active -= 1;
                    l.at[i] = l.at[l.active];
                    l.left[i] = l.left[l.active];
                    l.slot[i] = l.slot[l.active];
                }
            }
        }
        self.flush();
        Ok(l.steps)
    }

    /// Note the row of the record at `o`, then draw the slot of its next
    /// row among all its neighbours and prefetch it; [`NO_SLOT`] when the
    /// walk ends (its last row, a row without a neighbour, or a record
    /// [`WalkGraph::record_ok`] refuses: read nothing of it).
    #[inline]
    fn draw(&mut self, wg: &WalkGraph, o: usize, left: &mut u32, rng: &mut Xoshiro256pp) -> u32 {
        if !wg.record_ok(o) {
            return NO_SLOT;
        }
        let w = wg.words();
        self.note(w[o]);
        *left -= 1;
        let d = w[o + 1] + w[o + 2];
        if *left == 0 || d == 0 {
            return NO_SLOT;
        }
        let s = wg.slot(o, rng.below(u64::from(d)) as u32);
        prefetch(w, s);
        s as u32
    }

    /// The record the slot `s` of the record at `o` names, when it is a
    /// parent or a visible child; else one drawn among the visible
    /// neighbours (read at once: rare enough that deferring it costs
    /// more), or [`NO_SLOT`] when there is none. The record at `o` is the
    /// one [`draw`](Self::draw) accepted and drew `s` from.
    #[inline]
    fn read(
        &mut self,
        wg: &WalkGraph,
        o: usize,
        s: u32,
        crank: u32,
        rng: &mut Xoshiro256pp,
    ) -> u32 {
        let w = wg.words();
        let s = s as usize;
        let np = w[o + 1] as usize;
        // A parent, or a child whose rank (the word after it) is visible.
        if s < o + HEAD + np || w[s + 1] < crank {
            return w[s];
        }
        let d = w[o + 1] + self.cache.visible(wg, o, crank);
        if d == 0 {
            return NO_SLOT;
        }
        w[wg.slot(o, rng.below(u64::from(d)) as u32)]
    }

    /// The touched rows that count (not `seed`, dated before `bound` or
    /// undated) and that `keep` accepts, best first, at most `limit` of
    /// them: by visits (more first) or, with `prefer_latest`, by time
    /// (latest first, a row without time last) then visits; ties by a hash
    /// of `key` and the row, so equal rows are in a random but
    /// deterministic order. The first `limit` are those of the full order.
    ///
    /// The order's head is selected before the filters run (they read
    /// scattered rows; the rows they drop are few: the seed, rows reached
    /// only through an undated row's parent, unlabelled rows); when too few
    /// of the head pass, every touched row is filtered.
    #[allow(clippy::too_many_arguments)]
    pub fn ranked(
        &mut self,
        g: &GraphView<'_>,
        seed: u32,
        bound: i64,
        prefer_latest: bool,
        key: u64,
        keep: impl Fn(u32) -> bool,
        limit: usize,
        out: &mut Vec<u32>,
    ) {
        out.clear();
        let mut keyed = std::mem::take(&mut self.keyed);
        keyed.clear();
        let time = |r: u32| g.time_of(r).unwrap_or(i64::MIN);
        let passes = |r: u32| {
            let t = time(r);
            r != seed && (t == i64::MIN || t < bound) && keep(r)
        };
        // The order as one key, smallest first: latest time (with
        // `prefer_latest`), most visits, the tie hash, the row.
        let order = |r: u32| {
            let t = if prefer_latest { time(r) } else { 0 };
            let prio = mix64(key ^ u64::from(r).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            (Reverse(t), Reverse(self.get(r)), prio, r)
        };
        let head = 2 * limit + 16;
        keyed.extend(self.touched.iter().map(|&r| order(r)));
        top(&mut keyed, head);
        out.extend(keyed.iter().map(|k| k.3).filter(|&r| passes(r)).take(limit));
        if out.len() < limit && self.touched.len() > head {
            out.clear();
            keyed.clear();
            let all = self.touched.iter().copied().filter(|&r| passes(r));
            keyed.extend(all.map(order));
            top(&mut keyed, limit);
            out.extend(keyed.iter().map(|k| k.3));
        }
        self.keyed = keyed;
    }
}

/// The `n` smallest of `v`, sorted.
fn top<T: Ord>(v: &mut Vec<T>, n: usize) {
    if n == 0 {
        v.clear();
        return;
    }
    if v.len() > n {
        v.select_nth_unstable(n - 1);
        v.truncate(n);
    }
    v.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows 0..3 of table A (times 10, 20, 30), each a child of row 3 of
    /// table B (untimed).
    struct Tiny {
        row_table: Vec<u16>,
        row_time: Vec<i64>,
        fwd_offsets: Vec<u64>,
        fwd_targets: Vec<u32>,
        rev_offsets: Vec<u64>,
        rev_targets: Vec<u32>,
        rev_times: Vec<i64>,
        table_rows: Vec<(u32, u32)>,
    }

    fn tiny() -> Tiny {
        Tiny {
            row_table: vec![0, 0, 0, 1],
            row_time: vec![10, 20, 30, i64::MIN],
            fwd_offsets: vec![0, 1, 2, 3, 3],
            fwd_targets: vec![3, 3, 3],
            rev_offsets: vec![0, 0, 0, 0, 3],
            rev_targets: vec![0, 1, 2],
            rev_times: vec![10, 20, 30],
            table_rows: vec![(0, 3), (3, 4)],
        }
    }

    fn view(t: &Tiny) -> GraphView<'_> {
        GraphView {
            row_table: &t.row_table,
            row_time: &t.row_time,
            fwd_offsets: &t.fwd_offsets,
            fwd_targets: &t.fwd_targets,
            rev_offsets: &t.rev_offsets,
            rev_targets: &t.rev_targets,
            rev_times: &t.rev_times,
            file: None,
            table_rows: &t.table_rows,
        }
    }

    fn params(num_walks: usize) -> WalkParams {
        WalkParams {
            num_walks,
            walk_length: 5,
            cutoff: 20,
            bound: 20,
            table: (0, 3),
        }
    }

    #[test]
    fn walks_count_earlier_rows_of_the_table_and_never_the_seed_or_the_future() {
        let t = tiny();
        let g = view(&t);
        let wg = WalkGraph::new(&g).unwrap();
        let mut w = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(1);
        let steps = w.walk(&wg, 1, &params(1000), &mut rng, None).unwrap();
        // Every row has a neighbour: each walk takes walk_length - 1 steps.
        assert_eq!(steps, 1000 * 4);
        assert_eq!(w.get(2), 0, "a row after the cutoff was reached");
        assert_eq!(w.get(3), 0, "a row of another table counted");
        // Positions 2 and 4 are rows of A, each row 0 with probability 1/2.
        assert!((850..1150).contains(&w.get(0)), "{}", w.get(0));
        let mut out = Vec::new();
        w.ranked(&g, 1, 20, false, 7, |_| true, 10, &mut out);
        assert_eq!(out, vec![0], "the seed is never ranked");
        w.ranked(&g, 1, 20, false, 7, |r| r != 0, 10, &mut out);
        assert!(out.is_empty(), "keep is applied");
        w.ranked(&g, 1, 10, false, 7, |_| true, 10, &mut out);
        assert!(out.is_empty(), "a row at the bound is ranked");
        // The same generator gives the same counts (lanes in a fixed order).
        let mut again = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(1);
        again.walk(&wg, 1, &params(1000), &mut rng, None).unwrap();
        assert_eq!(again.get(0), w.get(0));
    }

    #[test]
    fn a_seed_at_a_later_time_sees_later_rows_and_counts_are_reset() {
        let t = tiny();
        let g = view(&t);
        let wg = WalkGraph::new(&g).unwrap();
        let mut w = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(2);
        w.walk(&wg, 1, &params(200), &mut rng, None).unwrap();
        let late = WalkParams {
            cutoff: 40,
            bound: 40,
            ..params(200)
        };
        w.walk(&wg, 2, &late, &mut rng, None).unwrap();
        assert!(w.get(0) > 0 && w.get(1) > 0, "{} {}", w.get(0), w.get(1));
        assert_eq!(w.touched.len(), 3, "the seed and rows 0, 1");
        // Recency first: row 1 (time 20) before row 0 (time 10).
        let mut out = Vec::new();
        w.ranked(&g, 2, 40, true, 3, |_| true, 10, &mut out);
        assert_eq!(out, vec![1, 0]);
        w.ranked(&g, 2, 40, true, 3, |_| true, 1, &mut out);
        assert_eq!(out, vec![1], "a limit keeps the head of the full order");
    }

    #[test]
    fn a_passed_deadline_stops_the_walks() {
        let t = tiny();
        let g = view(&t);
        let wg = WalkGraph::new(&g).unwrap();
        let mut w = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(3);
        let now = Instant::now();
        assert_eq!(w.walk(&wg, 1, &params(1000), &mut rng, Some(now)), Err(0));
        let far = now + std::time::Duration::from_secs(3600);
        assert!(w.walk(&wg, 1, &params(1000), &mut rng, Some(far)).is_ok());
    }
}
