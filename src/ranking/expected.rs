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
//! Pruning: a row whose share per neighbour is below `expected_prune`
//! (0.25 by default) of one expected visit of `num_walks` walks does not
//! spread it (its mass is dropped, so expected visits are never
//! overstated). A step's work is then at most `num_walks / expected_prune`
//! neighbour updates (each spreading row
//! gives each neighbour at least that share of a total of at most 1), and
//! in practice far fewer: mass reaching a hub stops there.
//!
//! The records a context's walks can reach, pruned, are few (thousands on
//! TPC-H SF 0.1, against 870,000 rows), and the probability circulates
//! among them for all `walk_length` steps. So each reached record gets a
//! local id (an open-addressed table keyed by record offset), and the first
//! time it spreads its visible neighbours are written as local ids into a
//! local adjacency list: every later step over it reads that short list and
//! adds into arrays of a few thousand floats that stay in the core's cache,
//! instead of reading the record and looking each neighbour up again.
//!
//! A record is read only once [`WalkGraph::record_ok`] accepted it (a
//! refused one is a dead end, and its failure fails the batch); a new
//! record's lines are only prefetched before that (a hint, in bounds).
//!
//! Hot-path invariants: no allocation per context after warm-up (the
//! table, the per-local arrays and the adjacency are per worker, emptied
//! after each context) and no random draw.

use std::time::Instant;

use super::walk_graph::{HubCache, HEAD};
use super::walks::{WalkCounts, WalkGraph, WalkParams};
use crate::prefetch::prefetch;

/// Records whose first spread is prefetched ahead of the current one.
const AHEAD: usize = 8;

/// Slots of the record → local id table before it first grows.
const FIRST_SLOTS: usize = 1 << 14;

/// A local record whose degree and row are not read yet.
const UNREAD: u32 = u32::MAX;

/// What the spread knows of one reached record (by local id).
#[derive(Debug, Clone, Copy)]
struct Local {
    /// The record's offset in the walk graph.
    rec: u32,
    /// Visible neighbours ([`UNREAD`] until first at a step).
    deg: u32,
    /// Its row's index in the seed's table, or `u32::MAX` for another
    /// table's row (read with `deg`).
    visit: u32,
    /// Its neighbours in `edges` (`start`, written at its first spread;
    /// [`UNREAD`] before).
    start: u32,
}

/// Per-worker scratch of the `expected` ranker.
#[derive(Debug, Default)]
pub struct Spread {
    /// Record offset + 1 and local id per slot (tag 0: free).
    index: Vec<(u32, u32)>,
    /// Table slots in use (cleared after each context).
    used: Vec<u32>,
    /// Per local id: the record and its neighbours.
    locals: Vec<Local>,
    /// Per local id: probability at the current and the next step (which
    /// is which alternates with the step's parity).
    mass: Vec<[f32; 2]>,
    /// Local ids of the spread records' neighbours (`Local::start`).
    edges: Vec<u32>,
    /// Local ids with probability at the current step.
    cur: Vec<u32>,
    /// The same for the next step: the first `n_next` (written ahead of
    /// the count so that a first touch is not a branch).
    next: Vec<u32>,
    n_next: usize,
    /// Expected visits per walk of the rows of the seed's table.
    visits: Vec<f32>,
    /// Rows of the seed's table with expected visits (table indexes).
    visited: Vec<u32>,
    /// Visible children of hubs.
    hubs: HubCache,
}

/// The home slot of `tag` in a table of `mask + 1` (multiplicative hash).
#[inline]
fn home(tag: u32, mask: usize) -> usize {
    (u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & mask
}

impl Spread {
    /// Set `counts` to the expected visits of `p.num_walks` walks from
    /// `seed` (rounded; rows expected less than half a visit are not
    /// counted), pruned at `prune` expected visits per neighbour. Returns the neighbour updates made, or `Err(updates)`
    /// when `deadline` passed first (read once per step).
    pub fn expected(
        &mut self,
        wg: &WalkGraph,
        seed: u32,
        p: &WalkParams,
        prune: f32,
        counts: &mut WalkCounts,
        deadline: Option<Instant>,
    ) -> Result<u64, u64> {
        counts.reset(p.table);
        if self.index.is_empty() {
            self.index = vec![(0, 0); FIRST_SLOTS];
        }
        let (lo, hi) = p.table;
        if self.visits.len() < (hi - lo) as usize {
            self.visits.resize((hi - lo) as usize, 0.0);
        }
        let Some(start) = wg.start_of(seed).map(|o| o as u32) else {
            return Ok(0);
        };
        if p.walk_length == 0 || p.num_walks == 0 {
            return Ok(0);
        }
        let crank = wg.visible_rank(p.cutoff);
        let floor = prune / p.num_walks as f32;
        let s = self.local(wg.words(), start);
        self.mass[s as usize][0] = 1.0;
        self.cur.push(s);
        let mut updates = 0u64;
        let mut result = Ok(());
        for t in 0..p.walk_length {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                result = Err(());
                break;
            }
            let last = t + 1 == p.walk_length;
            updates += self.step(wg, crank, floor, (lo, hi), t % 2, last);
            self.next.truncate(self.n_next);
            self.n_next = 0;
            std::mem::swap(&mut self.cur, &mut self.next);
            if self.cur.is_empty() {
                break;
            }
        }
        self.clear();
        let scale = p.num_walks as f32;
        for &i in &self.visited {
            let v = std::mem::take(&mut self.visits[i as usize]);
            let c = (v * scale).round();
            if c >= 1.0 {
                counts.set(lo + i, c.min(u32::MAX as f32) as u32);
            }
        }
        self.visited.clear();
        result.map(|()| updates).map_err(|()| updates)
    }

    /// Empty the table, the locals and the step lists.
    fn clear(&mut self) {
        for &i in &self.used {
            self.index[i as usize] = (0, 0);
        }
        self.used.clear();
        self.locals.clear();
        self.mass.clear();
        self.edges.clear();
        self.cur.clear();
        self.next.clear();
        self.n_next = 0;
    }

    /// One step: count the current records' visits, spread their
    /// probability (at `mass[..][now]`) into the next step's (unless
    /// `last`), clear it. Returns the updates made.
    fn step(
        &mut self,
        wg: &WalkGraph,
        crank: u32,
        floor: f32,
        table: (u32, u32),
        now: usize,
        last: bool,
    ) -> u64 {
        let mut updates = 0u64;
        for i in 0..self.cur.len() {
            if let Some(&a) = self.cur.get(i + AHEAD) {
                let l = self.locals[a as usize];
                if l.start == UNREAD {
                    prefetch(wg.words(), l.rec as usize);
                }
            }
            let id = self.cur[i] as usize;
            let m = std::mem::take(&mut self.mass[id][now]);
            if self.locals[id].deg == UNREAD {
                self.read(wg, id, crank, table);
            }
            let l = self.locals[id];
            if l.visit != u32::MAX {
                let v = &mut self.visits[l.visit as usize];
                if *v == 0.0 {
                    self.visited.push(l.visit);
                }
                *v += m;
            }
            let d = l.deg as usize;
            if last || d == 0 || m < floor * d as f32 {
                continue;
            }
            let share = m / d as f32;
            updates += d as u64;
            let first = if l.start == UNREAD {
                self.link(wg, id)
            } else {
                l.start as usize
            };
            if self.next.len() < self.n_next + d {
                self.next.resize(self.n_next + d, 0);
            }
            for k in first..first + d {
                let j = self.edges[k] as usize;
                let x = &mut self.mass[j][1 - now];
                self.next[self.n_next] = j as u32;
                self.n_next += usize::from(*x == 0.0);
                *x += share;
            }
        }
        updates
    }

    /// Read local `id`'s record: its visible degree and its row; a record
    /// [`WalkGraph::record_ok`] refuses is read as a dead end of no table
    /// (nothing of it is read: its failure fails the batch).
    fn read(&mut self, wg: &WalkGraph, id: usize, crank: u32, table: (u32, u32)) {
        let w = wg.words();
        let o = self.locals[id].rec as usize;
        if !wg.record_ok(o) {
            let l = &mut self.locals[id];
            (l.deg, l.visit) = (0, u32::MAX);
            return;
        }
        let nc = if w[o + 3] < crank {
            w[o + 2]
        } else {
            self.hubs.visible(wg, o, crank)
        };
        let r = w[o];
        let l = &mut self.locals[id];
        l.deg = w[o + 1] + nc;
        l.visit = if (table.0..table.1).contains(&r) {
            r - table.0
        } else {
            u32::MAX
        };
    }

    /// Write local `id`'s visible neighbours into `edges` as local ids
    /// (taken for new records); returns where they start. Only for a
    /// record [`read`](Self::read) accepted (a refused one has degree 0).
    fn link(&mut self, wg: &WalkGraph, id: usize) -> usize {
        let w = wg.words();
        let o = self.locals[id].rec as usize;
        let np = w[o + 1] as usize;
        let nc = self.locals[id].deg as usize - np;
        let first = self.edges.len();
        let base = o + HEAD;
        for k in 0..np + nc {
            let rec = if k < np {
                w[base + k]
            } else {
                w[base + 2 * k - np]
            };
            let j = self.local(w, rec);
            self.edges.push(j);
        }
        self.locals[id].start = first as u32;
        first
    }

    /// The local id of the record at `rec`, taken if new (the table is
    /// grown before it is half full). A new record's first lines are
    /// prefetched: it is read a step later at the earliest.
    #[inline]
    fn local(&mut self, w: &[u32], rec: u32) -> u32 {
        if 2 * (self.used.len() + 1) > self.index.len() {
            self.grow();
        }
        // Wrapping: `rec` is not checked yet (`read` refuses a bad one).
        let tag = rec.wrapping_add(1);
        let mask = self.index.len() - 1;
        let mut i = home(tag, mask);
        loop {
            let (k, id) = self.index[i];
            if k == tag {
                return id;
            }
            if k == 0 {
                let id = self.locals.len() as u32;
                self.index[i] = (tag, id);
                self.used.push(i as u32);
                self.locals.push(Local {
                    rec,
                    deg: UNREAD,
                    visit: u32::MAX,
                    start: UNREAD,
                });
                self.mass.push([0.0; 2]);
                prefetch(w, rec as usize);
                prefetch(w, rec as usize + 16);
                return id;
            }
            i = (i + 1) & mask;
        }
    }

    /// Double the table (local ids stay).
    #[cold]
    fn grow(&mut self) {
        let n = self.index.len() * 2;
        let old = std::mem::replace(&mut self.index, vec![(0, 0); n]);
        self.used.clear();
        for (tag, id) in old.into_iter().filter(|e| e.0 != 0) {
            let mut i = home(tag, n - 1);
            while self.index[i].0 != 0 {
                i = (i + 1) & (n - 1);
            }
            self.index[i] = (tag, id);
            self.used.push(i as u32);
        }
    }
}
