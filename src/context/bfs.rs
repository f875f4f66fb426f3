//! The BFS itself and its scratch space.

use crate::format::GraphView;
use crate::prefetch::prefetch;
use crate::rng::Xoshiro256pp;

/// What one BFS may do.
#[derive(Debug, Clone, Copy)]
pub struct BfsParams {
    /// Cell budget (the sequence length).
    pub max_cells: usize,
    /// Hops from the seed row at most.
    pub max_hops: usize,
    /// Children sampled per row per hop at most.
    pub child_width: usize,
    /// Drop children dated after the seed's observation time.
    pub temporal_filter: bool,
}

/// The result of one BFS, reused across seeds (cleared, not reallocated).
#[derive(Debug, Default, Clone)]
pub struct Subgraph {
    /// Included rows in BFS order; `rows[0]` is the seed.
    pub rows: Vec<u32>,
    /// Hop of each included row.
    pub depth: Vec<u8>,
    /// Table of each included row (as the BFS checked it: assembly reads
    /// it here instead of from the graph's `row_table` again).
    pub tables: Vec<u16>,
    /// `(child, parent)` local indices of every FK edge between included rows.
    pub edges: Vec<(u16, u16)>,
    /// Cells of the included rows (at most the budget).
    pub cells: usize,
    /// The cell budget of this context: the BFS's (`BfsParams::max_cells`),
    /// or the smaller one [`keep_prefix`](Self::keep_prefix) cut it to.
    pub budget: usize,
    /// Deepest hop reached.
    pub max_depth: u8,
    /// Cells of rows that were reached but did not fit the budget.
    pub cells_dropped: u64,
    /// Visible children not sampled because of the width cap.
    pub children_capped: u64,
    /// Rows hidden by the time filter (children, and parents dated after
    /// the cutoff, reachable only through rows without a time).
    pub temporal_filtered: u64,
    /// Included rows (other than the seed) whose time is after `obs_time`,
    /// counted from the rows' own times, independently of the filter (with
    /// examples: also an example row at or after the seed's time).
    pub temporal_leaks: u64,
    /// With examples: cells of each tier (0: the seed's BFS, 1: ranked
    /// examples' shells, 2: random examples' shells); else all zero.
    pub tier_cells: [u32; 3],
    /// With examples: example rows (tiers 1 and 2) in the context and the
    /// tier each entered in, in the order they entered.
    pub example_rows: Vec<(u32, u8)>,
    /// With examples of a forecast task: `(local row, item)` of each
    /// example item, in row order; assembly writes the item's label as a
    /// visible cell before its anchor row's cells.
    pub example_items: Vec<(u16, u32)>,
    /// With examples: random-walk steps taken building the context.
    pub walk_steps: u64,
    /// With examples: 1 when the build passed `context_deadline_ms` and the
    /// context was replaced by the seed's plain BFS context.
    pub deadline_hits: u32,
    /// With `expected_store`: 1 when the item's stored ranking ran out
    /// before the context was full and the live ranker built it.
    pub store_misses: u32,
}

impl Subgraph {
    pub(super) fn clear(&mut self) {
        self.rows.clear();
        self.depth.clear();
        self.tables.clear();
        self.edges.clear();
        self.cells = 0;
        self.budget = 0;
        self.max_depth = 0;
        self.cells_dropped = 0;
        self.children_capped = 0;
        self.temporal_filtered = 0;
        self.temporal_leaks = 0;
        self.tier_cells = [0; 3];
        self.example_rows.clear();
        self.example_items.clear();
        self.walk_steps = 0;
        self.deadline_hits = 0;
        self.store_misses = 0;
    }

    /// Cut this context to its longest prefix of rows (BFS order: the seed,
    /// then closest hop first) whose cells fit `budget`, as a packed
    /// sequence keeps a context larger than its share, without a second BFS.
    /// `row_cells` and `seed_cells` are the ones the BFS ran with; the
    /// prefix keeps every edge between its rows (each kept row keeps the
    /// edge from the row that reached it, which comes before it: the prefix
    /// is connected) and its leak count is recounted from `row_time` against
    /// `obs_time` (times of rows the BFS included, so read checked already). The cut rows' cells go to
    /// `cells_dropped`; the BFS's own counts (width cap, time filter) stay.
    /// A budget below the seed's cells keeps the seed row alone.
    pub fn keep_prefix(
        &mut self,
        budget: usize,
        row_cells: &[u16],
        seed_cells: usize,
        row_time: &[i64],
        obs_time: i64,
    ) {
        let mut cells = seed_cells.min(budget).min(self.cells);
        let mut n = 1.min(self.rows.len());
        while n < self.rows.len() {
            let c = row_cells
                .get(usize::from(self.tables[n]))
                .map_or(0, |&c| usize::from(c));
            if cells + c > budget {
                break;
            }
            cells += c;
            n += 1;
        }
        self.budget = budget;
        if n == self.rows.len() {
            return;
        }
        self.cells_dropped += (self.cells - cells) as u64;
        self.cells = cells;
        self.rows.truncate(n);
        self.depth.truncate(n);
        self.tables.truncate(n);
        self.edges
            .retain(|&(i, j)| usize::from(i) < n && usize::from(j) < n);
        self.example_items.retain(|&(i, _)| usize::from(i) < n);
        self.max_depth = self.depth.last().copied().unwrap_or(0);
        self.temporal_leaks = self.rows[1..]
            .iter()
            .filter(|&&r| {
                leaks(
                    row_time.get(r as usize).copied().unwrap_or(i64::MIN),
                    obs_time,
                )
            })
            .count() as u64;
    }
}

/// Whether an included row dated `t` is a leak for a seed observed at
/// `obs_time` (a row without a time never is).
#[inline]
pub(super) fn leaks(t: i64, obs_time: i64) -> bool {
    t != i64::MIN && t > obs_time
}

/// Per-worker scratch. Its size depends on the BFS budget, never on the
/// database: the visited set holds the rows one BFS touches (at most
/// `1 + hops · F · (P + W)` for frontier `F ≤ S` rows, `P` parents per row
/// and child width `W`), and the lists hold one hop's candidates.
#[derive(Debug, Default)]
pub struct BfsScratch {
    visited: Visited,
    frontier: Vec<u32>,
    parents: Vec<u32>,
    children: Vec<u32>,
    copy: Vec<u32>,
    picked: Vec<u32>,
}

const NOT_INCLUDED: u16 = u16::MAX;

impl BfsScratch {
    /// Bytes held by the scratch (capacity, not length).
    pub fn heap_bytes(&self) -> usize {
        let lists = self.frontier.capacity()
            + self.parents.capacity()
            + self.children.capacity()
            + self.copy.capacity()
            + self.picked.capacity();
        self.visited.slots.capacity() * std::mem::size_of::<Slot>() + lists * 4
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    row: u32,
    generation: u32,
    local: u16,
}

/// The rows one BFS visited and their local index: an open-addressing hash
/// map (linear probing, load ≤ 1/2) cleared in O(1) by bumping the
/// generation. Capacity follows the largest BFS seen, not the database.
#[derive(Debug, Default)]
struct Visited {
    slots: Vec<Slot>,
    generation: u32,
    len: usize,
    bits: u32,
}

impl Visited {
    const MIN_BITS: u32 = 10;

    fn clear(&mut self) {
        if self.slots.is_empty() {
            self.bits = Self::MIN_BITS;
            self.slots = vec![Slot::default(); 1 << self.bits];
        }
        self.len = 0;
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.slots.iter_mut().for_each(|s| s.generation = 0);
            self.generation = 1;
        }
    }

    #[inline]
    fn home(&self, row: u32) -> usize {
        (u64::from(row).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }

    /// The slot holding `row`, or the empty slot where it would go.
    #[inline]
    fn find(&self, row: u32) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(row);
        loop {
            let s = &self.slots[i];
            if s.generation != self.generation || s.row == row {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Mark `row` visited; `true` if it was not yet.
    #[inline]
    fn insert(&mut self, row: u32) -> bool {
        let i = self.find(row);
        if self.slots[i].generation == self.generation {
            return false;
        }
        self.slots[i] = Slot {
            row,
            generation: self.generation,
            local: NOT_INCLUDED,
        };
        self.len += 1;
        if 2 * self.len > self.slots.len() {
            self.grow();
        }
        true
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.bits += 1;
        self.slots = vec![Slot::default(); 1 << self.bits];
        for s in old.into_iter().filter(|s| s.generation == self.generation) {
            let i = self.find(s.row);
            self.slots[i] = s;
        }
    }

    /// Record the local index of visited `row`.
    #[inline]
    fn set_local(&mut self, row: u32, local: u16) {
        let i = self.find(row);
        debug_assert_eq!(self.slots[i].generation, self.generation);
        self.slots[i].local = local;
    }

    /// The local index of `row` if it was visited and included.
    #[inline]
    fn local(&self, row: u32) -> Option<u16> {
        let s = &self.slots[self.find(row)];
        (s.generation == self.generation && s.local != NOT_INCLUDED).then_some(s.local)
    }
}

/// Frontier rows whose parent and child lists are prefetched ahead.
const AHEAD: usize = 2;

/// Prefetch the first parent and child entries of frontier row `u`.
#[inline]
fn prefetch_lists(g: &GraphView<'_>, u: u32) {
    if let Some(&a) = g.fwd_offsets.get(u as usize) {
        prefetch(g.fwd_targets, a as usize);
    }
    if let Some(&a) = g.rev_offsets.get(u as usize) {
        prefetch(g.rev_times, a as usize);
        prefetch(g.rev_targets, a as usize);
    }
}

fn shuffle(v: &mut [u32], rng: &mut Xoshiro256pp) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// Append `k` of `ids` chosen uniformly without replacement to `out`, in
/// O(k) for any `ids.len()` (Floyd's algorithm for large lists; a partial
/// Fisher–Yates on a scratch copy for short ones).
fn sample_k(
    ids: &[u32],
    k: usize,
    rng: &mut Xoshiro256pp,
    copy: &mut Vec<u32>,
    picked: &mut Vec<u32>,
    out: &mut Vec<u32>,
) {
    let n = ids.len();
    if n <= k {
        out.extend_from_slice(ids);
        return;
    }
    if n <= 8 * k {
        copy.clear();
        copy.extend_from_slice(ids);
        for i in 0..k {
            let j = i + rng.below((n - i) as u64) as usize;
            copy.swap(i, j);
        }
        out.extend_from_slice(&copy[..k]);
        return;
    }
    picked.clear();
    for j in (n - k)..n {
        let t = rng.below(j as u64 + 1) as u32;
        let v = if picked.contains(&t) { j as u32 } else { t };
        picked.push(v);
    }
    out.extend(picked.iter().map(|&i| ids[i as usize]));
}

/// BFS from `seed` (global row) observed at `obs_time`. `row_cells[t]` is the
/// number of cells a row of table `t` contributes; the seed contributes
/// `seed_cells` (its row plus any task target cell).
#[allow(clippy::too_many_arguments)]
pub fn bfs(
    g: &GraphView<'_>,
    row_cells: &[u16],
    seed: u32,
    seed_cells: usize,
    obs_time: i64,
    p: &BfsParams,
    rng: &mut Xoshiro256pp,
    s: &mut BfsScratch,
    out: &mut Subgraph,
) {
    out.clear();
    s.visited.clear();
    s.visited.insert(seed);
    s.visited.set_local(seed, 0);
    out.rows.push(seed);
    out.depth.push(0);
    // The caller checked the seed's table (the task's anchor table).
    out.tables.push(g.table_code(seed).unwrap_or(0));
    out.cells = seed_cells.min(p.max_cells);
    out.budget = p.max_cells;
    let max_rows = max_rows(p);
    s.frontier.clear();
    s.frontier.push(seed);
    let cutoff = if p.temporal_filter {
        obs_time
    } else {
        i64::MAX
    };
    for hop in 1..=p.max_hops {
        if s.frontier.is_empty() || out.cells >= p.max_cells || out.rows.len() >= max_rows {
            break;
        }
        s.parents.clear();
        s.children.clear();
        reach_parents(g, cutoff, s, out);
        reach_children(g, cutoff, p.child_width, rng, s, out);
        // Ties within a hop are broken at random; parents stay first.
        shuffle(&mut s.parents, rng);
        shuffle(&mut s.children, rng);
        include_hop(g, row_cells, hop, obs_time, p, s, out);
    }
    for (i, &r) in out.rows.iter().enumerate() {
        for &par in g.parents(r) {
            if let Some(j) = s.visited.local(par) {
                out.edges.push((i as u16, j));
            }
        }
    }
}

/// Rows a subgraph holds at most: the cell budget, and what a `u16` local
/// index can name.
fn max_rows(p: &BfsParams) -> usize {
    p.max_cells.min(u16::MAX as usize - 1)
}

/// One hop's parents: the unvisited parents of the frontier, in frontier
/// order, into `s.parents`; those dated after `cutoff` are dropped and
/// counted as filtered.
#[inline]
fn reach_parents(g: &GraphView<'_>, cutoff: i64, s: &mut BfsScratch, out: &mut Subgraph) {
    for &u in s.frontier.iter().take(AHEAD) {
        prefetch_lists(g, u);
    }
    for i in 0..s.frontier.len() {
        let u = s.frontier[i];
        if let Some(&next) = s.frontier.get(i + AHEAD) {
            prefetch_lists(g, next);
        }
        for &par in g.parents(u) {
            if s.visited.insert(par) {
                prefetch(g.row_time, par as usize);
                prefetch(g.row_table, par as usize);
                s.parents.push(par);
            }
        }
    }
    // A parent dated after the cutoff is future data (it can only be
    // reached through a row without a time); parents are otherwise
    // taken unconditionally. (An out-of-range id from a corrupt payload
    // is dropped at inclusion.)
    let before = s.parents.len();
    s.parents.retain(|&par| {
        let t = g.time_of(par).unwrap_or(i64::MIN);
        t == i64::MIN || t <= cutoff
    });
    out.temporal_filtered += (before - s.parents.len()) as u64;
}

/// One hop's children: per frontier row, at most `child_width` of its
/// children visible at `cutoff`, sampled, the unvisited ones kept in order
/// into `s.children`; hidden and capped children are counted.
#[inline]
fn reach_children(
    g: &GraphView<'_>,
    cutoff: i64,
    child_width: usize,
    rng: &mut Xoshiro256pp,
    s: &mut BfsScratch,
    out: &mut Subgraph,
) {
    for i in 0..s.frontier.len() {
        let u = s.frontier[i];
        let (ids, times) = g.children(u);
        let visible = times.partition_point(|&t| t <= cutoff);
        out.temporal_filtered += (ids.len() - visible) as u64;
        if visible > child_width {
            out.children_capped += (visible - child_width) as u64;
        }
        let start = s.children.len();
        let (copy, picked, children) = (&mut s.copy, &mut s.picked, &mut s.children);
        sample_k(&ids[..visible], child_width, rng, copy, picked, children);
        // Drop already-visited children (keep order of the rest).
        let mut w = start;
        for r in start..s.children.len() {
            let c = s.children[r];
            if s.visited.insert(c) {
                prefetch(g.row_time, c as usize);
                prefetch(g.row_table, c as usize);
                s.children[w] = c;
                w += 1;
            }
        }
        s.children.truncate(w);
    }
}

/// Include hop `hop`'s rows, parents first, while they fit the budget: each
/// becomes a subgraph row and part of the next frontier; rows that do not
/// fit are counted as dropped cells, rows after `obs_time` as leaks.
#[inline]
fn include_hop(
    g: &GraphView<'_>,
    row_cells: &[u16],
    hop: usize,
    obs_time: i64,
    p: &BfsParams,
    s: &mut BfsScratch,
    out: &mut Subgraph,
) {
    let max_rows = max_rows(p);
    s.frontier.clear();
    for list in [0, 1] {
        let n = if list == 0 {
            s.parents.len()
        } else {
            s.children.len()
        };
        for i in 0..n {
            let r = if list == 0 {
                s.parents[i]
            } else {
                s.children[i]
            };
            // Only rows whose table checks out are read (corrupt payloads
            // give a smaller subgraph, never an out-of-bounds read).
            let Some((t, &c)) = g.table_of(r).and_then(|t| Some((t, row_cells.get(t)?))) else {
                continue;
            };
            let c = c as usize;
            if out.cells + c > p.max_cells || out.rows.len() >= max_rows {
                out.cells_dropped += c as u64;
                continue;
            }
            // The next hop (and the edge list) reads its CSR offsets.
            prefetch(g.fwd_offsets, r as usize);
            prefetch(g.rev_offsets, r as usize);
            s.visited.set_local(r, out.rows.len() as u16);
            out.rows.push(r);
            out.depth.push(hop as u8);
            out.tables.push(t as u16);
            out.cells += c;
            out.max_depth = hop as u8;
            s.frontier.push(r);
            // The leak check reads the row's own time, not the CSR times
            // or the cutoff the filter used, so it stays an independent
            // witness (and lights up when the filter is off).
            if leaks(g.time_of(r).unwrap_or(i64::MIN), obs_time) {
                out.temporal_leaks += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_k_is_uniform_and_distinct_for_hubs() {
        let ids: Vec<u32> = (0..1000).collect();
        let mut rng = Xoshiro256pp::seed_from_u64(3);
        let (mut copy, mut picked, mut out) = (vec![], vec![], vec![]);
        let mut hits = vec![0u32; 1000];
        for _ in 0..2000 {
            out.clear();
            sample_k(&ids, 10, &mut rng, &mut copy, &mut picked, &mut out);
            let mut o = out.clone();
            o.sort_unstable();
            o.dedup();
            assert_eq!(o.len(), 10);
            for &x in &out {
                hits[x as usize] += 1;
            }
        }
        // 20 expected hits each; no index starved or favoured grossly.
        assert!(
            hits.iter().all(|&h| h > 3 && h < 45),
            "{:?}",
            (hits.iter().min(), hits.iter().max())
        );
        assert!(copy.is_empty(), "hub path must not copy the neighbour list");
    }
}
