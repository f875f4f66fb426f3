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
use crate::prefetch::prefetch;
use crate::rng::{mix64, Xoshiro256pp};

/// Walks between two reads of the clock for the deadline.
pub const WALKS_PER_CLOCK: usize = 64;

/// Walks advanced in lockstep (TPC-H SF 0.1, RT-J recipe, one thread on a
/// loaded 2-core box: 1 lane 0.87, 8 2.65, 16 3.4, 32 4.0, 64 4.0
/// batches per CPU-second).
pub const LANES: usize = 32;

/// The FK graph as random walks read it: per row one 32-byte node (its
/// time, its latest child's time, where its neighbours start and how many
/// parents and children it has) and one adjacency list of parents then
/// time-sorted children, with the children's times beside them. Built once
/// per database when `examples` is on; a step touches one node and one
/// adjacency slot (plus a binary search over the row's children only when
/// some of them are after the cutoff).
#[derive(Debug, Default)]
pub struct WalkGraph {
    nodes: Vec<Node>,
    adj: Vec<u32>,
    times: Vec<i64>,
}

#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct Node {
    row_time: i64,
    last_child_time: i64,
    start: u64,
    np: u32,
    nc: u32,
}

impl WalkGraph {
    /// The walk graph of `g` (O(rows + edges)).
    pub fn new(g: &GraphView<'_>) -> Self {
        let n = g.num_rows();
        let edges = g.fwd_targets.len() + g.rev_targets.len();
        let mut w = WalkGraph {
            nodes: Vec::with_capacity(n),
            adj: Vec::with_capacity(edges),
            times: Vec::with_capacity(edges),
        };
        for u in 0..n as u32 {
            let parents = g.parents(u);
            let (ids, times) = g.children(u);
            w.nodes.push(Node {
                row_time: g.time_of(u).unwrap_or(i64::MIN),
                last_child_time: times.last().copied().unwrap_or(i64::MIN),
                start: w.adj.len() as u64,
                np: parents.len() as u32,
                nc: ids.len() as u32,
            });
            w.adj.extend_from_slice(parents);
            w.adj.extend_from_slice(ids);
            w.times.extend(std::iter::repeat_n(i64::MIN, parents.len()));
            w.times.extend_from_slice(times);
        }
        w
    }

    /// Bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<Node>() + self.adj.len() * 4 + self.times.len() * 8
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaneState {
    Idle,
    AtNode,
    Search,
    Moving,
}

/// One walk in flight.
#[derive(Debug, Clone, Copy)]
struct Lane {
    state: LaneState,
    /// The row it is at (`AtNode`) or leaves (`Moving`).
    u: u32,
    /// Rows it still visits, this one included.
    left: usize,
    /// The adjacency slot of its next row (`Moving`).
    idx: usize,
}

impl Lane {
    const IDLE: Lane = Lane {
        state: LaneState::Idle,
        u: 0,
        left: 0,
        idx: 0,
    };
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

    /// Run `p.num_walks` walks from `seed` over `wg` and count their
    /// visits. Returns the steps taken, or `Err(steps)` when `deadline`
    /// passed first (read every [`WALKS_PER_CLOCK`] walk starts).
    ///
    /// [`LANES`] walks advance in lockstep, each step split in two halves
    /// (pick the neighbour and prefetch its adjacency slot; read it and
    /// prefetch its node), so one walk's cache misses overlap the others'
    /// work. The lanes draw from one generator in a fixed order: the counts
    /// are a function of the seed and the generator, never of timing.
    pub fn walk(
        &mut self,
        wg: &WalkGraph,
        seed: u32,
        p: &WalkParams,
        rng: &mut Xoshiro256pp,
        deadline: Option<Instant>,
    ) -> Result<u64, u64> {
        self.reset(p.table);
        let mut lanes = [Lane::IDLE; LANES];
        let (mut started, mut steps) = (0usize, 0u64);
        if p.walk_length == 0 || wg.nodes.get(seed as usize).is_none() {
            return Ok(0);
        }
        loop {
            let mut busy = false;
            for l in &mut lanes {
                match l.state {
                    LaneState::Idle => {
                        if started == p.num_walks {
                            continue;
                        }
                        if started % WALKS_PER_CLOCK == 0
                            && deadline.is_some_and(|d| Instant::now() >= d)
                        {
                            return Err(steps);
                        }
                        started += 1;
                        *l = Lane {
                            state: LaneState::AtNode,
                            u: seed,
                            left: p.walk_length,
                            idx: 0,
                        };
                    }
                    LaneState::AtNode => self.visit(wg, seed, p, rng, l),
                    LaneState::Search => {
                        let nd = &wg.nodes[l.u as usize];
                        let first = (nd.start + u64::from(nd.np)) as usize;
                        let times = &wg.times[first..first + nd.nc as usize];
                        let nc = times.partition_point(|&t| t <= p.cutoff) as u64;
                        pick(wg, nd, nc, rng, l);
                    }
                    LaneState::Moving => {
                        l.u = wg.adj[l.idx];
                        prefetch(&wg.nodes, l.u as usize);
                        if let Some(i) = l.u.checked_sub(p.table.0) {
                            prefetch(&self.counts, i as usize);
                        }
                        // A corrupt payload's out-of-range row ends the walk.
                        l.state = if (l.u as usize) < wg.nodes.len() {
                            LaneState::AtNode
                        } else {
                            LaneState::Idle
                        };
                        steps += 1;
                    }
                }
                busy = true;
            }
            if !busy {
                return Ok(steps);
            }
        }
    }

    /// The first half of a step: count lane `l`'s row, then pick its next
    /// row and prefetch the adjacency slot naming it (or end the walk).
    #[inline]
    fn visit(
        &mut self,
        wg: &WalkGraph,
        seed: u32,
        p: &WalkParams,
        rng: &mut Xoshiro256pp,
        l: &mut Lane,
    ) {
        let (lo, hi) = p.table;
        let u = l.u;
        let nd = &wg.nodes[u as usize];
        if u != seed && lo <= u && u < hi && (nd.row_time == i64::MIN || nd.row_time < p.bound) {
            let c = &mut self.counts[(u - lo) as usize];
            if *c == 0 {
                self.touched.push(u);
            }
            *c += 1;
        }
        l.left -= 1;
        if l.left == 0 {
            l.state = LaneState::Idle;
        } else if nd.last_child_time > p.cutoff {
            // Some children are after the cutoff: their times are searched
            // next round, once prefetched.
            prefetch(&wg.times, (nd.start + u64::from(nd.np)) as usize);
            l.state = LaneState::Search;
        } else {
            pick(wg, nd, u64::from(nd.nc), rng, l);
        }
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
        let time = |r: u32| g.time_of(r).unwrap_or(i64::MIN);
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

/// Pick lane `l`'s next row among `nd`'s parents and its first `nc`
/// children and prefetch the adjacency slot naming it (or end the walk at
/// a row without a neighbour).
#[inline]
fn pick(wg: &WalkGraph, nd: &Node, nc: u64, rng: &mut Xoshiro256pp, l: &mut Lane) {
    let n = u64::from(nd.np) + nc;
    if n == 0 {
        l.state = LaneState::Idle;
        return;
    }
    l.idx = (nd.start + rng.below(n)) as usize;
    prefetch(&wg.adj, l.idx);
    l.state = LaneState::Moving;
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
        let wg = WalkGraph::new(&g);
        let mut w = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(1);
        let steps = w.walk(&wg, 1, &params(1000), &mut rng, None).unwrap();
        // Every row has a neighbour: each walk takes walk_length - 1 steps.
        assert_eq!(steps, 1000 * 4);
        assert_eq!(w.get(1), 0, "the seed counted");
        assert_eq!(w.get(2), 0, "a row after the cutoff was reached");
        assert_eq!(w.get(3), 0, "a row of another table counted");
        // Positions 2 and 4 are rows of A, each row 0 with probability 1/2.
        assert!((850..1150).contains(&w.get(0)), "{}", w.get(0));
        let mut out = Vec::new();
        w.ranked(&g, false, 7, |_| true, &mut out);
        assert_eq!(out, vec![0]);
        w.ranked(&g, false, 7, |r| r != 0, &mut out);
        assert!(out.is_empty(), "keep is applied");
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
        let wg = WalkGraph::new(&g);
        let mut w = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(2);
        w.walk(&wg, 1, &params(200), &mut rng, None).unwrap();
        let late = WalkParams {
            cutoff: 40,
            bound: 40,
            ..params(200)
        };
        w.walk(&wg, 2, &late, &mut rng, None).unwrap();
        assert_eq!(w.get(2), 0, "the seed counted");
        assert!(w.get(0) > 0 && w.get(1) > 0, "{} {}", w.get(0), w.get(1));
        assert_eq!(w.touched.len(), 2);
        // Recency first: row 1 (time 20) before row 0 (time 10).
        let mut out = Vec::new();
        w.ranked(&g, true, 3, |_| true, &mut out);
        assert_eq!(out, vec![1, 0]);
    }

    #[test]
    fn a_passed_deadline_stops_the_walks() {
        let t = tiny();
        let g = view(&t);
        let wg = WalkGraph::new(&g);
        let mut w = WalkCounts::default();
        let mut rng = Xoshiro256pp::seed_from_u64(3);
        let now = Instant::now();
        assert_eq!(w.walk(&wg, 1, &params(1000), &mut rng, Some(now)), Err(0));
        let far = now + std::time::Duration::from_secs(3600);
        assert!(w.walk(&wg, 1, &params(1000), &mut rng, Some(far)).is_ok());
    }
}
