//! In-context contexts (`examples = true`, docs/contexts.md): one sequence
//! holds the seed's own BFS and, as in-context examples, other labelled
//! rows of the seed's table, each with its own BFS shell.
//!
//! - tier 0: the seed's BFS, capped at the sequence's `local_size` cells;
//! - tier 1: rows of the seed's table ranked by the walk visit counts
//!   (`crate::ranking`), or by recency first with `prefer_latest`, each with
//!   its BFS shell (at most `local_size` cells, width `bfs_width`) until
//!   the context is full;
//! - tier 2: random rows of the table, those the walks did not visit
//!   first, the same way, until the context is full or no eligible
//!   labelled row of the table is left.
//!
//! Rules: an example is a row of the seed's table other than the seed,
//! with a label (`has_label`) known at the seed's time (`labels`), of a
//! split the seed may see (`splits`: its own or an earlier one), and
//! dated strictly before the seed's observation time or undated (a row at
//! the seed's own horizon never enters); its shell is cut at its own time (or the seed's, when it has
//! none). A ranked row the context already holds (an earlier BFS reached
//! it) keeps its place and gets no shell of its own. Rows are added whole, each once, while they fit `S`; the edges are
//! every FK edge between the context's rows. The seed is row 0, so assembly
//! masks its target and writes the examples' labels as ordinary cells.
//! A forecast (query) task's examples are its earlier items instead
//! (`items.rs`: the window rule, a ranked row's latest eligible item),
//! each shell cut at the item's observation time and its label a visible
//! cell before its row (`Subgraph::example_items`).
//! `temporal_leaks` counts, from the rows' own times and independently of
//! the filters, every row after the seed's time and every example row at
//! or after it, in every tier.
//!
//! Determinism: everything random comes from the sequence's generator key;
//! only a passed deadline (wall clock) makes a context depend on timing, and
//! such a context is replaced by the seed's plain BFS context and counted.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

use super::bfs::{bfs, leaks, BfsParams, BfsScratch, Subgraph};
use super::items::TaskItems;
use super::labels::LabelTimes;
use super::splits::ExampleSplits;
use crate::format::GraphView;
use crate::ranking::rank_store::RankStore;
use crate::ranking::rankers::{rank, RankArgs, RankScratch, Ranker};
use crate::ranking::walks::{WalkGraph, WalkParams};
use crate::rng::{mix64, Xoshiro256pp};

/// One sequence's draws from the recipe's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRecipe {
    /// Cell budget of the seed's BFS and of each example's shell.
    pub local_size: usize,
    /// BFS child width of every BFS of the context.
    pub bfs_width: usize,
    /// Rank examples by recency first.
    pub prefer_latest: bool,
}

impl SeqRecipe {
    /// The draws of the sequence whose generator key is `key`: one index
    /// per list, from a generator of its own (`key` mixed), so the draws
    /// never shift the BFS's stream.
    pub fn draw(key: u64, sizes: &[usize], widths: &[usize], latest: &[bool]) -> Self {
        let mut rng = Xoshiro256pp::seed_from_u64(mix64(key ^ 0x7265_6369_7065));
        let mut pick = |n: usize| rng.below(n.max(1) as u64) as usize;
        SeqRecipe {
            local_size: sizes[pick(sizes.len())],
            bfs_width: widths[pick(widths.len())],
            prefer_latest: latest[pick(latest.len())],
        }
    }
}

/// What every context of one task reads besides the graph.
#[derive(Clone, Copy)]
pub struct ExampleParams<'a> {
    /// The sequence length `S` (the context's cell budget).
    pub seq_len: usize,
    /// BFS hops of every BFS.
    pub max_hops: usize,
    /// Time filter of every BFS, walk and example choice (off: a
    /// diagnostic under which the leak invariant lights up).
    pub temporal_filter: bool,
    /// Walks per context (0: tier 1 is empty).
    pub num_walks: usize,
    /// Rows each walk visits.
    pub walk_length: usize,
    /// Global row range `[lo, hi)` of the seed's table.
    pub table: (u32, u32),
    /// The graph as the walks read it (built once per database).
    pub walk_graph: &'a WalkGraph,
    /// Cells of a row of each table.
    pub row_cells: &'a [u16],
    /// Cells of the seed row (its row plus any task target cell).
    pub seed_cells: usize,
    /// Whether a row of the seed's table has a label.
    pub has_label: &'a (dyn Fn(u32) -> bool + Sync),
    /// The wall-clock budget of one context, if any.
    pub deadline: Option<std::time::Duration>,
    /// How tier 1 is ranked.
    pub ranker: Ranker,
    /// The `expected` ranker's pruning (`expected_prune`).
    pub prune: f32,
    /// Mixed into the walks' generator key (0 in training; the recall
    /// benchmark's independent runs of the same context set others).
    pub walk_salt: u64,
    /// The `expected` ranker's stored rankings of the database, if any
    /// (`expected_store`; the same picks, read instead of computed).
    pub store: Option<&'a RankStore>,
    /// When each row's label becomes known, if not at its own time: a row
    /// whose label was not known at the seed's time is no example.
    pub labels: Option<LabelTimes<'a>>,
    /// A forecast task's items (`None`: a cell task): examples are then
    /// items, not rows, each with its label as an extra visible cell.
    pub items: Option<TaskItems<'a>>,
    /// Which examples' labels the seeds' split may see (`splits.rs`; by
    /// row offset in `table` for a cell task, by item for a forecast task).
    /// `None` shows every split: only a context built outside any split
    /// (a test of the tiers) leaves it out; the maker always sets it.
    pub splits: Option<ExampleSplits<'a>>,
}

/// Per-worker scratch of in-context builds (reused, never per context).
#[derive(Default)]
pub struct ExampleScratch {
    pub(super) rank: RankScratch,
    ranked: Vec<u32>,
    shell: Subgraph,
    pub(super) local: HashMap<u32, u16, BuildHasherDefault<RowHasher>>,
}

/// A multiplicative hasher for row ids (distinct `u32`s).
#[derive(Default)]
pub(super) struct RowHasher(u64);

impl Hasher for RowHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Why a build stopped.
pub(super) enum Stop {
    /// The deadline passed.
    Deadline,
    /// The stored ranking's exact head ran out before the context was
    /// full: the live ranker must build it.
    Live,
}

/// Build the in-context context of `seed` observed at `obs_time` into
/// `out`, its generator keyed by `key`. Past `p.deadline` the context is
/// replaced by the seed's plain BFS (budget `S`, width `fallback_width`).
#[allow(clippy::too_many_arguments)]
pub fn build_in_context(
    g: &GraphView<'_>,
    seed: u32,
    obs_time: i64,
    key: u64,
    r: &SeqRecipe,
    p: &ExampleParams<'_>,
    fallback_width: usize,
    bs: &mut BfsScratch,
    sc: &mut ExampleScratch,
    out: &mut Subgraph,
) {
    let deadline = p.deadline.map(|d| Instant::now() + d);
    let mut done = tiers(g, seed, obs_time, key, r, p, deadline, bs, sc, out);
    let missed = matches!(done, Err(Stop::Live));
    if missed {
        let live = ExampleParams { store: None, ..*p };
        done = tiers(g, seed, obs_time, key, r, &live, deadline, bs, sc, out);
    }
    if done.is_ok() {
        out.store_misses = u32::from(missed);
        return;
    }
    let steps = out.walk_steps;
    let params = BfsParams {
        max_cells: p.seq_len,
        max_hops: p.max_hops,
        child_width: fallback_width,
        temporal_filter: p.temporal_filter,
    };
    let mut rng = Xoshiro256pp::seed_from_u64(key);
    bfs(
        g,
        p.row_cells,
        seed,
        p.seed_cells,
        obs_time,
        &params,
        &mut rng,
        bs,
        out,
    );
    out.tier_cells = [u32::try_from(out.cells).unwrap_or(u32::MAX), 0, 0];
    out.walk_steps = steps;
    out.deadline_hits = 1;
    out.store_misses = u32::from(missed);
}

/// The three tiers into `out`; `Err` when `deadline` passed.
#[allow(clippy::too_many_arguments)]
fn tiers(
    g: &GraphView<'_>,
    seed: u32,
    obs_time: i64,
    key: u64,
    r: &SeqRecipe,
    p: &ExampleParams<'_>,
    deadline: Option<Instant>,
    bs: &mut BfsScratch,
    sc: &mut ExampleScratch,
    out: &mut Subgraph,
) -> Result<(), Stop> {
    let mut bfs_rng = Xoshiro256pp::seed_from_u64(key);
    // The seed row is whole whatever the drawn size.
    let params = BfsParams {
        max_cells: r.local_size.max(p.seed_cells).min(p.seq_len),
        max_hops: p.max_hops,
        child_width: r.bfs_width,
        temporal_filter: p.temporal_filter,
    };
    bfs(
        g,
        p.row_cells,
        seed,
        p.seed_cells,
        obs_time,
        &params,
        &mut bfs_rng,
        bs,
        out,
    );
    out.budget = p.seq_len;
    out.tier_cells[0] = u32::try_from(out.cells).unwrap_or(u32::MAX);
    sc.local.clear();
    for (i, &row) in out.rows.iter().enumerate() {
        sc.local.insert(row, i as u16);
    }
    let bound = if p.temporal_filter {
        obs_time
    } else {
        i64::MAX
    };
    let fill = Fill {
        g,
        p,
        r,
        obs_time,
        bound,
        deadline,
    };
    let (ranked, partial) = rank_examples(g, seed, key, r, p, &fill, sc, out)?;
    let res = ranked.iter().try_for_each(|&row| match p.items {
        // A ranked row stands for its latest eligible item.
        Some(it) => it
            .latest(row, fill.bound, |j| fill.shown(j))
            .map_or(Ok(()), |j| {
                fill.example(row, Some(j), 1, &mut bfs_rng, bs, sc, out)
            }),
        None => fill.example(row, None, 1, &mut bfs_rng, bs, sc, out),
    });
    sc.ranked = ranked;
    res?;
    // Past a partial stored ranking's exact head (or in tier 2, which
    // skips every counted row) only the live counts decide.
    if partial && !fill.full(out) {
        return Err(Stop::Live);
    }
    fill.random_examples(seed, key, &mut bfs_rng, bs, sc, out)?;
    finish_edges(g, sc, out);
    Ok(())
}

/// Tier 1's ranking (`p.ranker`) of `seed`'s context, whose tier 0 is
/// `out` (its rows in `sc.local`); the walk steps go to `out`. The ranked
/// rows are `sc.ranked`'s buffer, handed back by the caller, with whether
/// they came from an incomplete stored ranking.
#[allow(clippy::too_many_arguments)]
fn rank_examples(
    g: &GraphView<'_>,
    seed: u32,
    key: u64,
    r: &SeqRecipe,
    p: &ExampleParams<'_>,
    fill: &Fill<'_, '_>,
    sc: &mut ExampleScratch,
    out: &mut Subgraph,
) -> Result<(Vec<u32>, bool), Stop> {
    let wp = WalkParams {
        num_walks: p.num_walks,
        walk_length: p.walk_length,
        cutoff: fill.bound,
        bound: fill.bound,
        table: p.table,
    };
    let mut walk_rng = Xoshiro256pp::seed_from_u64(mix64(key ^ 0x7761_6c6b ^ p.walk_salt));
    // Each ranked row the fill reads is a row of the table already held
    // (at most S / its cells) or an example (the same bound): the head of
    // the order is all it ever reads.
    let ec = fill.example_cells();
    let room = p.seq_len.saturating_sub(out.cells);
    let stored = match (p.ranker, p.store) {
        (Ranker::Expected, Some(st)) => st.get(seed, fill.bound),
        _ => None,
    };
    let partial = stored.is_some_and(|s| !s.complete());
    let local = &sc.local;
    // A forecast task's row counts if it has an item eligible at the bound;
    // a cell task's if it is labelled; either of a split the seed may see.
    let has_item = |row: u32| {
        p.items
            .is_some_and(|it| it.latest(row, fill.bound, |j| fill.shown(j)).is_some())
    };
    let has_row_label = |row: u32| (p.has_label)(row) && fill.shown(row.wrapping_sub(p.table.0));
    let has_label: &(dyn Fn(u32) -> bool + Sync) = if p.items.is_some() {
        &has_item
    } else {
        &has_row_label
    };
    let args = RankArgs {
        g,
        seed,
        bound: fill.bound,
        prefer_latest: r.prefer_latest,
        key,
        limit: 2 * (p.seq_len / ec + 1),
        take: room.div_ceil(r.local_size.max(ec)) + 1,
        has_label,
        prune: p.prune,
        held: &|row| local.contains_key(&row),
        stored,
    };
    let mut ranked = std::mem::take(&mut sc.ranked);
    let walked = rank(
        p.ranker,
        &mut sc.rank,
        p.walk_graph,
        &wp,
        &args,
        &mut walk_rng,
        fill.deadline,
        &mut ranked,
    );
    match walked {
        Ok(s) => {
            out.walk_steps = s;
            Ok((ranked, partial))
        }
        Err(s) => {
            sc.ranked = ranked;
            out.walk_steps = s;
            Err(Stop::Deadline)
        }
    }
}

/// One context's example filling: what every shell reads.
pub(super) struct Fill<'g, 'p> {
    pub(super) g: &'p GraphView<'g>,
    pub(super) p: &'p ExampleParams<'p>,
    r: &'p SeqRecipe,
    obs_time: i64,
    /// Example rows must be dated before this, and forecast items' windows
    /// closed by it (`i64::MAX`: filter off).
    pub(super) bound: i64,
    pub(super) deadline: Option<Instant>,
}

impl Fill<'_, '_> {
    /// Cells of one example: a row of the seed's table, and a forecast
    /// item's label cell.
    fn example_cells(&self) -> usize {
        let t = self.g.table_of(self.p.table.0).unwrap_or(0);
        let row = self
            .p
            .row_cells
            .get(t)
            .map_or(1, |&c| usize::from(c).max(1));
        row + usize::from(self.p.items.is_some())
    }

    /// Whether no further example row fits.
    pub(super) fn full(&self, out: &Subgraph) -> bool {
        self.p.seq_len.saturating_sub(out.cells) < self.example_cells()
    }

    /// Whether candidate `c` (a row offset in the seed's table for a cell
    /// task, an item for a forecast task) is of a split the seed may see.
    #[inline]
    pub(super) fn shown(&self, c: u32) -> bool {
        self.p.splits.is_none_or(|s| s.shows(c))
    }

    /// Whether `row` may be an example (time rule; the label and split are
    /// checked by the caller's ranking or draw).
    pub(super) fn eligible_time(&self, row: u32) -> bool {
        let t = self.g.time_of(row).unwrap_or(i64::MIN);
        t == i64::MIN || t < self.bound
    }

    /// Whether `row`'s label was known at the seed's time (always, with the
    /// filter off: a diagnostic under which `label_leaks` lights up).
    fn label_known(&self, row: u32) -> bool {
        !self.p.temporal_filter
            || self
                .p
                .labels
                .is_none_or(|l| l.known(self.g, row, self.obs_time))
    }

    /// Add example `row` (tier `tier`) and its shell, unless the context is
    /// full or already holds it. A forecast task's example is its `item`,
    /// whose shell is cut at the item's observation time.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn example(
        &self,
        row: u32,
        item: Option<u32>,
        tier: usize,
        rng: &mut Xoshiro256pp,
        bs: &mut BfsScratch,
        sc: &mut ExampleScratch,
        out: &mut Subgraph,
    ) -> Result<(), Stop> {
        if self.full(out) || sc.local.contains_key(&row) || !self.label_known(row) {
            return Ok(());
        }
        let item = item
            .zip(self.p.items)
            .map(|(j, it)| (j, it.obs[j as usize]));
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Stop::Deadline);
        }
        let t = match item {
            Some((_, o)) if o != i64::MAX => o,
            Some(_) => i64::MIN,
            None => self.g.time_of(row).unwrap_or(i64::MIN),
        };
        let cut = if t == i64::MIN || !self.p.temporal_filter {
            self.obs_time
        } else {
            t.min(self.obs_time)
        };
        let room = self.p.seq_len - out.cells;
        let params = BfsParams {
            max_cells: self.r.local_size.min(room),
            max_hops: self.p.max_hops,
            child_width: self.r.bfs_width,
            temporal_filter: self.p.temporal_filter,
        };
        let ec = self.example_cells();
        bfs(
            self.g,
            self.p.row_cells,
            row,
            ec,
            cut,
            &params,
            rng,
            bs,
            &mut sc.shell,
        );
        self.merge(tier, item.map(|(j, _)| j), sc, out);
        Ok(())
    }

    /// Add the shell's rows the context does not hold, in shell order,
    /// while they fit `S`; its root is the example (with its label cell
    /// when it is forecast `item`).
    fn merge(&self, tier: usize, item: Option<u32>, sc: &mut ExampleScratch, out: &mut Subgraph) {
        let shell = &sc.shell;
        let before = out.cells;
        for (i, (&row, &t)) in shell.rows.iter().zip(&shell.tables).enumerate() {
            if sc.local.contains_key(&row) {
                continue;
            }
            let c = self
                .p
                .row_cells
                .get(usize::from(t))
                .map_or(0, |&c| usize::from(c))
                + usize::from(i == 0 && item.is_some());
            if out.cells + c > self.p.seq_len || out.rows.len() >= usize::from(u16::MAX - 1) {
                out.cells_dropped += c as u64;
                if i == 0 {
                    return;
                }
                continue;
            }
            sc.local.insert(row, out.rows.len() as u16);
            out.rows.push(row);
            out.depth.push(shell.depth[i]);
            out.tables.push(t);
            out.cells += c;
            let time = self.g.time_of(row).unwrap_or(i64::MIN);
            // The witness reads the row's own time: an example at or after
            // the seed's time, or any row after it, is a leak.
            if leaks(time, self.obs_time) || (i == 0 && time != i64::MIN && time >= self.obs_time) {
                out.temporal_leaks += 1;
            }
            if i == 0 {
                out.example_rows.push((row, tier as u8));
                if let Some(j) = item {
                    out.example_items.push((out.rows.len() as u16 - 1, j));
                }
            }
        }
        out.children_capped += shell.children_capped;
        out.temporal_filtered += shell.temporal_filtered;
        out.max_depth = out.max_depth.max(shell.max_depth);
        out.tier_cells[tier] += u32::try_from(out.cells - before).unwrap_or(u32::MAX);
    }
}

/// Every FK edge between the context's rows, as `(child, parent)` local
/// indices.
fn finish_edges(g: &GraphView<'_>, sc: &ExampleScratch, out: &mut Subgraph) {
    out.edges.clear();
    for (i, &r) in out.rows.iter().enumerate() {
        for par in g.parents(r) {
            if let Some(&j) = sc.local.get(par) {
                out.edges.push((i as u16, j));
            }
        }
    }
}
