//! Packing: the contexts of several seeds (segments) in one sequence.
//!
//! With `pack`, a batch of `B` sequences holds the contexts of the rank's
//! `B · pack_factor` draws of the step, 1 to `K = 2 · pack_factor` per
//! sequence (`SamplerConfig::max_segments`), one after another: segment `k` occupies a contiguous run of positions,
//! seed row first and led by its target cell, exactly as an unpacked
//! sequence lays out its one context. What stays true per segment:
//!
//! - **Placement.** Every context is first built as its unpacked self (a
//!   BFS with budget `S`); [`pack_contexts`] then chooses each one's
//!   sequence, balancing the sequences' cells (largest context first, into
//!   the least-filled sequence with a free segment slot: a large context
//!   gets few companions, small ones fill the rest), and, when the contexts
//!   do not all fit whole, a water level: only contexts larger than the
//!   largest level that fits are cut, to that level plus whatever cells
//!   their sequence has left. A sequence's segments are its contexts in
//!   draw order. Since `S ≥ pack_factor ·` the widest seed row (checked
//!   when the sampler is made), every context keeps at least its seed row.
//! - **Intact** (the definition this module keeps): a context is either
//!   its unpacked context, cell for cell, or, if cut, the longest prefix of
//!   its unpacked context's rows (BFS order: the seed, then closest hop
//!   first) that fits its budget, with every edge between the kept rows
//!   (`Subgraph::keep_prefix`: no second BFS; each kept row still has the
//!   edge it was reached by, so the prefix is connected). The cut rows'
//!   cells are counted in `truncation/cells_dropped`, as rows that do not
//!   fit `S` unpacked are. It lies in one sequence, in one contiguous run;
//!   no context is split across sequences and no drawn seed is left out. A
//!   cut context is counted in `packing/contexts_cut`.
//! - **Isolation.** Rows are numbered per sequence (segment `k`'s rows
//!   follow segment `k − 1`'s), `fk_adj` has no edge between segments,
//!   `col_perm` orders positions by (segment, column, position) and
//!   `out_perm` / `in_perm` are each segment's reverse Cuthill–McKee order,
//!   segment after segment: no ordering interleaves two segments.
//!   `segment_ids` gives each cell's segment (`u16::MAX` on padding);
//!   `target_pos [B, K]` the position of each segment's target cell,
//!   `target_count [B]` how many segments the sequence holds and
//!   `segment_seeds [B, K]` each segment's seed (its position in the task's
//!   seed list; `u32::MAX` past `target_count`).
//!
//! Without `pack`, `K = 1` and the single segment's budget is `S`: the same
//! BFS and layout as the seed design, byte for byte.
//!
//! Must never: let a cell, edge or ordering of one segment reach another,
//! leave a drawn seed out, or cut a context no larger than the water level.

use super::assemble::{assemble_sequence, AssembleScratch, SeqContext};
use super::slots::{SegOut, SeqOut};
use crate::context::Subgraph;
use crate::readings::SeqReadings;
use crate::rng::mix64;

/// Where a packed batch's contexts go: `bins` sequences of `s` cells, each
/// holding at most `per_bin` of the contexts (`sizes.len() ≤ bins · per_bin`),
/// whose unpacked sizes (cells, BFS budget `s`) are `sizes`. Returns each
/// context's sequence and its budget: a context whose budget is at least its
/// size is placed whole (it is its unpacked context); the others are *cut*
/// (to the longest prefix of their rows that fits the budget, which keeps
/// their closest hops), and the level (below).
///
/// The rule, longest-processing-time first with a water level:
/// - contexts are taken largest first (ties: draw order), each into the
///   sequence with the fewest cells so far that still has a free segment
///   slot (ties: the lowest index), which balances the sequences' loads:
///   large contexts get sequences of their own or few companions, small
///   ones fill the rest;
/// - if the contexts do not all fit whole, every size is capped at the
///   largest level `T` (binary search over `floor ..= max size`) at which
///   that placement fits: only contexts larger than `T` are cut, never a
///   small one; `T = floor` always fits if `⌈n / bins⌉ · floor ≤ s` (at
///   equal sizes the placement is round robin; `floor` is the seed row's
///   cells, and `pack_factor ·` the widest seed row `≤ S` is checked when
///   the sampler is made);
/// - a sequence's cells left under `s` then go back to its cut contexts,
///   in draw order, up to their unpacked sizes.
pub fn pack_contexts(
    sizes: &[usize],
    bins: usize,
    per_bin: usize,
    s: usize,
    floor: usize,
) -> PackPlan {
    let n = sizes.len();
    debug_assert!(n <= bins * per_bin);
    debug_assert!(n.div_ceil(bins.max(1)) * floor <= s);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut bin = vec![0usize; n];
    let mut load = vec![0usize; bins];
    let mut count = vec![0usize; bins];
    let mut place = |cap: usize, bin: &mut [usize], load: &mut [usize]| -> bool {
        load.fill(0);
        count.fill(0);
        for &i in &order {
            let mut best = usize::MAX;
            for q in 0..bins {
                if count[q] < per_bin && (best == usize::MAX || load[q] < load[best]) {
                    best = q;
                }
            }
            bin[i] = best;
            load[best] += sizes[i].min(cap);
            count[best] += 1;
        }
        load.iter().all(|&l| l <= s)
    };
    let max = sizes.iter().copied().max().unwrap_or(0);
    let level = if place(max, &mut bin, &mut load) {
        max
    } else {
        // Largest feasible level in floor ..= max - 1: `lo` always fits.
        let (mut lo, mut hi) = (floor.min(max), max);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if place(mid, &mut bin, &mut load) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let fits = place(lo, &mut bin, &mut load);
        debug_assert!(fits, "the floor level always fits");
        lo
    };
    let mut budget: Vec<usize> = sizes.iter().map(|&c| c.min(level)).collect();
    let mut free: Vec<usize> = load.iter().map(|&l| s.saturating_sub(l)).collect();
    for i in 0..n {
        let q = bin[i];
        let extra = (sizes[i] - budget[i]).min(free[q]);
        budget[i] += extra;
        free[q] -= extra;
    }
    PackPlan { bin, budget, level }
}

/// The share of a batch's cells the automatic count (`pack_factor = 0`)
/// leaves as padding at most, on its probe.
pub const PADDING_GOAL: f64 = 0.04;

/// Seeds per step for `bins` sequences of `s` cells whose contexts have the
/// probed unpacked `sizes` (cells), at least `bins` and at most
/// `bins · fit`: the fewest, from the count that fills the sequences on
/// average (`bins · s / mean size`) up in steps of `bins / 8`, whose
/// [`probe_padding`] is at most [`PADDING_GOAL`]. The mean alone leaves the
/// room that the sizes' spread and whole contexts cannot fill (10 % at
/// TPC-H SF 0.1); a few more contexts, the largest cut to the water level,
/// fill it.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
pub fn auto_count(sizes: &[usize], bins: usize, s: usize, fit: usize, floor: usize) -> usize {
    let (lo, hi) = (bins, bins * fit.max(1));
    if sizes.is_empty() || bins == 0 {
        return lo;
    }
    let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    let mut n = ((bins as f64 * s as f64 / mean.max(1.0)).round() as usize).clamp(lo, hi);
    let step = (bins / 8).max(1);
    while n < hi && probe_padding(sizes, n, bins, s, floor) > PADDING_GOAL {
        n = (n + step).min(hi);
    }
    n
}

/// Batches [`probe_padding`] places.
const PROBE_BATCHES: u64 = 16;

/// The mean padding (share of cells) of [`PROBE_BATCHES`] batches of `n`
/// contexts in `bins` sequences of `s` cells placed by [`pack_contexts`]
/// (`2·⌈n / bins⌉` slots per sequence), each context's size drawn from
/// `sizes` (with replacement, by a fixed hash: a batch's draw varies as a
/// real one does, the same every time).
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
pub fn probe_padding(sizes: &[usize], n: usize, bins: usize, s: usize, floor: usize) -> f64 {
    let mut probe = Vec::with_capacity(n);
    let mut used = 0usize;
    for r in 0..PROBE_BATCHES {
        probe.clear();
        probe
            .extend((0..n as u64).map(|i| {
                sizes[(mix64((r << 32) ^ i ^ 0x7061_636b) % sizes.len() as u64) as usize]
            }));
        let plan = pack_contexts(&probe, bins, 2 * n.div_ceil(bins), s, floor);
        used += probe
            .iter()
            .zip(&plan.budget)
            .map(|(&c, &b)| c.min(b))
            .sum::<usize>();
    }
    1.0 - used as f64 / (PROBE_BATCHES as usize * bins * s) as f64
}

/// What [`pack_contexts`] decided for each context of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackPlan {
    /// The sequence of each context.
    pub bin: Vec<usize>,
    /// The BFS budget of each context (at least its size: placed whole).
    pub budget: Vec<usize>,
    /// The water level: contexts of at most this many cells are whole.
    pub level: usize,
}

/// Write one sequence from the contexts `subs` of its seeds (`seeds`: each
/// one's position in the task's seed list), segment after segment, as the
/// module doc lays out; `r` is the batch's max rows, `s_len` the sequence
/// length the unpacked budget would be. Returns the sequence's measurements
/// (sums over segments; depth the deepest).
pub fn assemble_packed_sequence(
    ctx: &SeqContext<'_>,
    subs: &[Subgraph],
    seeds: &[u32],
    r: usize,
    o: &mut SeqOut<'_>,
    seg: &mut SegOut<'_>,
    s: &mut AssembleScratch,
) -> SeqReadings {
    let seq_len = o.semantic_types.len();
    let mut total = SeqReadings::default();
    let (mut off, mut row_off) = (0usize, 0usize);
    for (k, (sub, &seed)) in subs.iter().zip(seeds).enumerate() {
        let len = sub.cells.min(seq_len - off);
        let mut out = o.segment(off, len, row_off, r);
        let st = assemble_sequence(ctx, sub, seed as usize, r, &mut out, s);
        for p in off..off + len {
            o.col_perm[p] += off as u16;
            o.out_perm[p] += off as u16;
            o.in_perm[p] += off as u16;
            o.seq_row_ids[p] += row_off as u16;
        }
        seg.segment_ids[off..off + len].fill(k as u16);
        seg.target_pos[k] = off as u16;
        seg.segment_seeds[k] = seed;
        total.depth = total.depth.max(st.depth);
        total.rows += st.rows;
        total.cells += st.cells;
        total.cells_dropped += st.cells_dropped;
        total.children_capped += st.children_capped;
        total.temporal_filtered += st.temporal_filtered;
        total.temporal_leaks += st.temporal_leaks;
        total.label_leaks += st.label_leaks;
        total.contexts_cut += u32::from(sub.cells_dropped > 0 && sub.budget < seq_len);
        for (t, c) in total.tier_cells.iter_mut().zip(st.tier_cells) {
            *t += c;
        }
        total.examples += st.examples;
        total.walk_steps += st.walk_steps;
        total.deadline_hits += st.deadline_hits;
        total.store_misses += st.store_misses;
        total.no_examples += st.no_examples;
        total.positive_examples += st.positive_examples;
        off += len;
        row_off += sub.rows.len();
    }
    *seg.target_count = subs.len() as u8;
    total.segments = subs.len() as u32;
    seg.segment_ids[off..].fill(u16::MAX);
    for perm in [&mut *o.col_perm, &mut *o.out_perm, &mut *o.in_perm] {
        for (p, slot) in perm.iter_mut().enumerate().skip(off) {
            *slot = p as u16;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::{auto_count, pack_contexts, probe_padding, PADDING_GOAL};
    use proptest::prelude::*;

    /// Check one plan against the rules of [`pack_contexts`]; returns the
    /// number of contexts cut.
    fn check(sizes: &[usize], bins: usize, k: usize, s: usize, floor: usize) -> usize {
        assert!(
            sizes.len() >= bins,
            "test inputs give every sequence a context"
        );
        let plan = pack_contexts(sizes, bins, k, s, floor);
        let (bin, budget) = (&plan.bin, &plan.budget);
        let mut load = vec![0; bins];
        let mut count = vec![0; bins];
        for i in 0..sizes.len() {
            load[bin[i]] += budget[i].min(sizes[i]);
            count[bin[i]] += 1;
            assert!(
                budget[i] >= floor.min(sizes[i]),
                "budget below the seed row"
            );
        }
        assert!(
            count.iter().all(|&c| (1..=k).contains(&c)),
            "{count:?}: 1 to k contexts per sequence"
        );
        assert!(
            load.iter().all(|&l| l <= s),
            "{load:?}: a sequence overflows"
        );
        let mut cut = 0;
        for i in 0..sizes.len() {
            if sizes[i] <= plan.level {
                assert!(budget[i] >= sizes[i], "a context under the level is cut");
            }
            if budget[i] < sizes[i] {
                cut += 1;
                assert!(budget[i] >= plan.level, "a cut context below the level");
                assert_eq!(load[bin[i]], s, "a cut context's sequence has cells left");
            }
        }
        cut
    }

    #[test]
    fn contexts_that_fit_are_never_cut_and_large_ones_are_cut_to_a_level() {
        // Pairs that fit whole once large is matched with small.
        assert_eq!(
            check(&[900, 100, 800, 200, 700, 300, 600, 400], 4, 2, 1024, 8),
            0
        );
        // With spare slots a large context gets a sequence to itself and
        // small ones share the other: nothing is cut.
        let plan = pack_contexts(&[1000, 100, 100, 100], 2, 4, 1024, 8);
        assert_eq!(plan.bin, [0, 1, 1, 1]);
        assert_eq!(plan.budget, [1000, 100, 100, 100]);
        // Too much for the sequences: only the largest are cut.
        let sizes = [1024, 1024, 100, 90, 80, 70, 60, 50];
        let plan = pack_contexts(&sizes, 2, 8, 1024, 8);
        assert_eq!(
            &plan.budget[2..],
            &sizes[2..],
            "the small contexts stay whole"
        );
        assert!(plan.budget[0] < 1024 && plan.budget[1] < 1024);
        assert_eq!(check(&sizes, 2, 8, 1024, 8), 2);
        // Everything at the seed row's size: the floor always fits.
        assert_eq!(check(&[256; 8], 2, 4, 1024, 256), 0);
        assert_eq!(check(&[1024; 8], 2, 8, 1024, 256), 8);
    }

    #[test]
    fn the_automatic_count_fills_the_sequences_past_the_mean() {
        // Sizes spread 100..=1000 (S = 1024, 32 sequences): the mean's
        // count leaves more padding than the goal; the count found is the
        // first, in steps of B / 8, at or under it.
        let sizes: Vec<usize> = (0..64).map(|i| 100 + (i * 397) % 901).collect();
        let pad = |n: usize| probe_padding(&sizes, n, 32, 1024, 8);
        let mean = sizes.iter().sum::<usize>() as f64 / 64.0;
        let start = (32.0 * 1024.0 / mean).round() as usize;
        assert!(
            pad(start) > PADDING_GOAL,
            "the probe must need more than the mean"
        );
        let n = auto_count(&sizes, 32, 1024, 64, 8);
        assert!(n > start && pad(n) <= PADDING_GOAL && pad(n - 4) > PADDING_GOAL);
        // Contexts that fill S are not packed; the cap holds.
        assert_eq!(auto_count(&[1024; 64], 32, 1024, 64, 8), 32);
        assert_eq!(auto_count(&[30; 64], 4, 1024, 8, 8), 32);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn plans_fit_and_place_every_context(
            bins in 1usize..=8, k in 1usize..=6, floor in 1usize..=16,
            extra in 0usize..=600, raw in prop::collection::vec(0usize..=1000, 48),
        ) {
            // `k` contexts per sequence on average, up to `2k` in one.
            let s = k * floor + extra;
            let sizes: Vec<usize> = raw.iter().take(bins * k).map(|&x| floor + x % (s - floor + 1)).collect();
            prop_assume!(sizes.len() == bins * k);
            check(&sizes, bins, if k == 1 { 1 } else { 2 * k }, s, floor);
        }
    }
}
