//! The example rankers of tier 1 (`example_ranker`, docs/contexts.md):
//! which rows of the seed's table, best first, a context takes as
//! examples.
//!
//! - `walks`: `num_walks` random walks from the seed, rows by visit count
//!   (or recency first), RT-J's semantics (`super::walks`).
//! - `adaptive`: the same walks, run in blocks of [`BLOCK`]; after each
//!   block the rows the context would take (the first `k` ranked rows it
//!   does not hold yet, `k` the examples its room fits) are compared with
//!   the previous block's, and the walks stop once they have stayed the
//!   same for [`PATIENCE`] blocks, or at [`MAX_WALKS`] (or `num_walks`).
//!   Same walks, same order: only how many walks run changes.
//! - `expected`: the visit counts `num_walks` walks are expected to give,
//!   computed by spreading the walk's probability over the graph step by
//!   step, no walk drawn (`super::expected`), or read from the item's
//!   stored ranking (`super::rank_store`), then cut to the head the
//!   store vouches for.
//! - `shuffled` (measurement only, never a config value): the rows the
//!   walks visited in a random order, the broken ranker the recall
//!   benchmark's test must score low.
//!
//! Never: an allocation per context (the ranked list and the signature
//! are per-worker scratch), or a random draw outside the walk generator
//! and the sequence's key.

use std::time::Instant;

use super::expected::Spread;
use super::rank_store::StoredRanking;
use super::walks::{WalkCounts, WalkGraph, WalkParams};
use crate::format::GraphView;
use crate::rng::{mix64, Xoshiro256pp};

/// Walks between two stability checks of `adaptive` (one round of lanes).
pub const BLOCK: usize = 64;

/// Checks in a row with the same rows taken before `adaptive` stops.
pub const PATIENCE: usize = 2;

/// Walks `adaptive` runs at most (fewer when `num_walks` is lower).
pub const MAX_WALKS: usize = 256;

/// How tier 1 is ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranker {
    /// Visit counts of all `num_walks` walks.
    Walks,
    /// Walks in blocks until the rows taken are stable.
    Adaptive,
    /// The visit counts the walks are expected to give, no walk drawn.
    Expected,
    /// Visited rows in a random order (a broken ranker, for measurement).
    Shuffled,
}

/// Per-worker scratch of the rankers.
#[derive(Debug, Default)]
pub struct RankScratch {
    /// Visit counts (every ranker orders these).
    pub walks: WalkCounts,
    /// `adaptive`'s previous block's rows taken.
    sig: Vec<u32>,
    /// `expected`'s probabilities.
    spread: Spread,
}

/// What a ranking reads besides the walks.
pub struct RankArgs<'a, 'g> {
    /// The database's graph.
    pub g: &'a GraphView<'g>,
    /// The seed row (never ranked).
    pub seed: u32,
    /// Ranked rows are dated before this or undated.
    pub bound: i64,
    /// Recency first.
    pub prefer_latest: bool,
    /// The sequence's key (ties, `shuffled`'s order).
    pub key: u64,
    /// Ranked rows the fill can read at most.
    pub limit: usize,
    /// Examples the context's room fits (`adaptive`'s stable set).
    pub take: usize,
    /// The `expected` ranker's pruning (`expected_prune`).
    pub prune: f32,
    /// Whether a row has a label.
    pub has_label: &'a (dyn Fn(u32) -> bool + Sync),
    /// Whether the context holds a row already (it gets no shell).
    pub held: &'a dyn Fn(u32) -> bool,
    /// `expected`'s stored ranking of this item, if any.
    pub stored: Option<StoredRanking<'a>>,
}

impl RankArgs<'_, '_> {
    /// The first `limit` rows of the order of `walks`' counts that may be
    /// examples (labelled, not the seed, before the bound) into `out`.
    fn order(&self, walks: &mut WalkCounts, prefer_latest: bool, limit: usize, out: &mut Vec<u32>) {
        let label = |r: u32| (self.has_label)(r);
        walks.ranked(
            self.g,
            self.seed,
            self.bound,
            prefer_latest,
            self.key,
            label,
            limit,
            out,
        );
    }
}

/// Rank the examples of one context into `ranked`, best first; `Ok` the
/// walk steps taken (`expected`: neighbour updates), `Err` those taken
/// before `deadline` passed.
#[allow(clippy::too_many_arguments)]
pub fn rank(
    ranker: Ranker,
    sc: &mut RankScratch,
    wg: &WalkGraph,
    wp: &WalkParams,
    a: &RankArgs<'_, '_>,
    rng: &mut Xoshiro256pp,
    deadline: Option<Instant>,
    ranked: &mut Vec<u32>,
) -> Result<u64, u64> {
    let walks = &mut sc.walks;
    let steps = match ranker {
        Ranker::Walks | Ranker::Shuffled => walks.walk(wg, a.seed, wp, rng, deadline)?,
        Ranker::Adaptive => adaptive(walks, wg, wp, a, rng, deadline, ranked, &mut sc.sig)?,
        Ranker::Expected => match &a.stored {
            Some(s) => {
                s.load(walks, wp.table);
                0
            }
            None => sc
                .spread
                .expected(wg, a.seed, wp, a.prune, walks, deadline)?,
        },
    };
    // `shuffled` takes every visited row, then orders them at random.
    let shuffled = ranker == Ranker::Shuffled;
    let limit = if shuffled { usize::MAX } else { a.limit };
    a.order(walks, a.prefer_latest && !shuffled, limit, ranked);
    if shuffled {
        ranked.sort_unstable_by_key(|&r| mix64(a.key ^ 0x7368_7566 ^ u64::from(r)));
        ranked.truncate(a.limit);
    }
    if let Some(s) = &a.stored {
        let exact = |&r: &u32| s.exact(a.g, a.prefer_latest, r, walks.get(r));
        let n = ranked.iter().take_while(|r| exact(r)).count();
        ranked.truncate(n);
    }
    Ok(steps)
}

/// `adaptive`'s walks: blocks of [`BLOCK`] until the rows the context
/// would take are the same [`PATIENCE`] checks in a row.
#[allow(clippy::too_many_arguments)]
fn adaptive(
    walks: &mut WalkCounts,
    wg: &WalkGraph,
    wp: &WalkParams,
    a: &RankArgs<'_, '_>,
    rng: &mut Xoshiro256pp,
    deadline: Option<Instant>,
    ranked: &mut Vec<u32>,
    sig: &mut Vec<u32>,
) -> Result<u64, u64> {
    walks.reset(wp.table);
    sig.clear();
    let (mut done, mut steps, mut stable) = (0usize, 0u64, 0usize);
    let most = wp.num_walks.min(MAX_WALKS);
    while done < most {
        let n = BLOCK.min(most - done);
        steps += walks
            .more(wg, a.seed, wp, n, done, rng, deadline)
            .map_err(|s| steps + s)?;
        done += n;
        // The rows taken are a prefix of the order: rank only a short head
        // (the full one costs a sort of hundreds of rows per block), and
        // the whole `limit` only when held rows crowd that head out.
        let short = (2 * a.take + 8).min(a.limit);
        for limit in [short, a.limit] {
            a.order(walks, a.prefer_latest, limit, ranked);
            let free = ranked.iter().filter(|&&r| !(a.held)(r)).count();
            if free >= a.take || ranked.len() < limit || limit == a.limit {
                break;
            }
        }
        let taken = ranked
            .iter()
            .copied()
            .filter(|&r| !(a.held)(r))
            .take(a.take);
        if taken.clone().eq(sig.iter().copied()) {
            stable += 1;
            if stable >= PATIENCE {
                break;
            }
        } else {
            stable = 0;
            sig.clear();
            sig.extend(taken);
        }
    }
    Ok(steps)
}
