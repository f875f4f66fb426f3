//! Packing: the contexts of several seeds (segments) in one sequence.
//!
//! With `pack`, sequence `b` of a batch holds the contexts of its
//! `K = pack_factor` seeds (the rank's draws `b·K .. (b+1)·K` of the step),
//! one after another: segment `k` occupies a contiguous run of positions,
//! seed row first and led by its target cell, exactly as an unpacked
//! sequence lays out its one context. What stays true per segment:
//!
//! - **Budget.** The contexts of a sequence are built in segment order; the
//!   BFS of segment `k` runs with the budget [`segment_budget`] gives it:
//!   its fair share of the space left, `⌊left / (K − k)⌋`; the last segment
//!   gets all that is left. Since `S ≥ K ·` the widest seed row (checked
//!   when the sampler is made), every share holds its seed row. So a small context leaves its
//!   unused share to the segments after it, and padding remains only when
//!   every context of the sequence ran out of rows (frontier empty or
//!   `max_hops`) before the sequence was full.
//! - **Intact** (the definition this module keeps): a context is the whole
//!   output of one BFS from its seed under its budget — the same rule an
//!   unpacked sequence applies with budget `S` (closest hop first, rows that
//!   do not fit are counted in `truncation/cells_dropped`). It lies in one
//!   sequence, in one contiguous run, and no cell of it is dropped or moved
//!   after the BFS; no context is split across sequences, no drawn seed is
//!   left out, and no BFS result is thrown away. A context whose BFS
//!   stopped at a packing budget below `S` with rows left over is counted
//!   in `packing/contexts_cut` (it is smaller than an unpacked sequence
//!   would have made it).
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
//! Must never: let a cell, edge or ordering of one segment reach another, or
//! reorder segments (segment `k` is the sequence's `k`-th draw).

use super::assemble::{assemble_sequence, AssembleScratch, SeqContext, SeqOut};
use super::{SeqStats, TIMESTAMP_DIM};
use crate::sampler::Subgraph;

/// The BFS budget of the next segment of a sequence with `left` free cells
/// and `seeds_left` seeds still to place (this one included): the fair
/// share `⌊left / seeds_left⌋`. If `left >= seeds_left · m` (every seed row
/// has at most `m` cells) then the share is at least `m` and what it leaves
/// is at least `(seeds_left − 1) · m`: every later seed keeps room for its
/// row, whatever the contexts before it used.
pub fn segment_budget(left: usize, seeds_left: usize) -> usize {
    left / seeds_left.max(1)
}

/// One sequence's slices of the per-segment tensors.
pub struct SegOut<'b> {
    /// `[S]` slice of `segment_ids`.
    pub segment_ids: &'b mut [u16],
    /// `[K]` slice of `target_pos`.
    pub target_pos: &'b mut [u16],
    /// This sequence's entry of `target_count`.
    pub target_count: &'b mut u8,
    /// `[K]` slice of `segment_seeds`.
    pub segment_seeds: &'b mut [u32],
}

impl SeqOut<'_> {
    /// The positions `off .. off + len` of this sequence, with row
    /// adjacency viewed from row `row_off` on (stride `r`), as a sequence of
    /// their own: what [`assemble_sequence`] writes one segment into.
    fn segment(&mut self, off: usize, len: usize, row_off: usize, r: usize) -> SeqOut<'_> {
        let end = off + len;
        let adj_start = (row_off * r + row_off).min(self.fk_adj.len());
        SeqOut {
            semantic_types: &mut self.semantic_types[off..end],
            column_ids: &mut self.column_ids[off..end],
            seq_row_ids: &mut self.seq_row_ids[off..end],
            numeric_values: &mut self.numeric_values[off..end],
            timestamp_values: &mut self.timestamp_values[off * TIMESTAMP_DIM..end * TIMESTAMP_DIM],
            bool_values: &mut self.bool_values[off..end],
            categorical_embed_ids: &mut self.categorical_embed_ids[off..end],
            text_embed_ids: &mut self.text_embed_ids[off..end],
            is_null: &mut self.is_null[off..end],
            is_target: &mut self.is_target[off..end],
            is_padding: &mut self.is_padding[off..end],
            fk_adj: &mut self.fk_adj[adj_start..],
            col_perm: &mut self.col_perm[off..end],
            out_perm: &mut self.out_perm[off..end],
            in_perm: &mut self.in_perm[off..end],
        }
    }
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
) -> SeqStats {
    let seq_len = o.semantic_types.len();
    let mut total = SeqStats::default();
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
        total.contexts_cut += u32::from(sub.cells_dropped > 0 && sub.budget < seq_len);
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
    use super::segment_budget;

    #[test]
    fn budgets_are_fair_shares_that_leave_every_later_seed_its_row() {
        assert_eq!(segment_budget(1024, 1), 1024);
        assert_eq!(segment_budget(1024, 4), 256);
        // A small first context leaves its share to the rest.
        assert_eq!(segment_budget(1024 - 40, 3), 328);
        // Whatever each context uses of its share (here: all of it, or its
        // seed row only), every later seed still has room for its row.
        let m = 8;
        for s in 16..300 {
            for k in 1..=(s / m).min(8) {
                for greedy in [true, false] {
                    let mut left = s;
                    for j in 0..k {
                        let b = segment_budget(left, k - j);
                        assert!(b >= m, "S {s} K {k} segment {j}: budget {b}");
                        left -= if greedy { b } else { m };
                    }
                }
            }
        }
    }
}
