//! The batch's tensors as per-sequence output slices: [`SeqOut`] (a
//! sequence's cells, adjacency and permutations), [`SegOut`] (its
//! per-segment tensors), and [`Batch::fill_sequences`], which hands each
//! worker its sequence's slices, initialised to padding in that core's cache.
//!
//! Owns the one `unsafe` step of assembly (viewing the initialised spare
//! capacity as the tensors' elements); writes nothing but padding itself.
//! Imports neither `assemble` nor `pack`: both write through these slices.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::timestamp::TIMESTAMP_DIM;
use super::Batch;

/// One sequence's slices of the batch tensors.
pub struct SeqOut<'b> {
    /// `[S]` slice of the batch tensor of the same name.
    pub semantic_types: &'b mut [i8],
    /// `[S]` slice of the batch tensor of the same name.
    pub column_ids: &'b mut [i32],
    /// `[S]` slice of the batch tensor of the same name.
    pub seq_row_ids: &'b mut [u16],
    /// `[S]` slice of the batch tensor of the same name.
    pub numeric_values: &'b mut [f32],
    /// `[S, TIMESTAMP_DIM]` slice of the batch tensor of the same name.
    pub timestamp_values: &'b mut [f32],
    /// `[S]` slice of the batch tensor of the same name.
    pub bool_values: &'b mut [u8],
    /// `[S]` slice of the batch tensor of the same name.
    pub categorical_embed_ids: &'b mut [u32],
    /// `[S]` slice of the batch tensor of the same name.
    pub text_embed_ids: &'b mut [u32],
    /// `[S]` slice of the batch tensor of the same name.
    pub is_null: &'b mut [u8],
    /// `[S]` slice of the batch tensor of the same name.
    pub is_target: &'b mut [u8],
    /// `[S]` slice of the batch tensor of the same name.
    pub is_padding: &'b mut [u8],
    /// `[R, R]` slice of the batch tensor of the same name.
    pub fk_adj: &'b mut [u8],
    /// `[S]` slice of the batch tensor of the same name.
    pub col_perm: &'b mut [u16],
    /// `[S]` slice of the batch tensor of the same name.
    pub out_perm: &'b mut [u16],
    /// `[S]` slice of the batch tensor of the same name.
    pub in_perm: &'b mut [u16],
}

/// The `[B, S]` (and `[B, S, 15]`) tensors of a batch being assembled, as
/// uninitialised per-sequence slices: each is initialised (to the value a
/// padding cell has) by the worker that then writes the sequence's cells,
/// while it is in that core's cache, instead of by a serial pass over the
/// whole batch before the parallel phase.
struct SeqSlots<'b> {
    semantic_types: &'b mut [MaybeUninit<i8>],
    column_ids: &'b mut [MaybeUninit<i32>],
    seq_row_ids: &'b mut [MaybeUninit<u16>],
    numeric_values: &'b mut [MaybeUninit<f32>],
    timestamp_values: &'b mut [MaybeUninit<f32>],
    bool_values: &'b mut [MaybeUninit<u8>],
    categorical_embed_ids: &'b mut [MaybeUninit<u32>],
    text_embed_ids: &'b mut [MaybeUninit<u32>],
    is_null: &'b mut [MaybeUninit<u8>],
    is_target: &'b mut [MaybeUninit<u8>],
    is_padding: &'b mut [MaybeUninit<u8>],
    col_perm: &'b mut [MaybeUninit<u16>],
    out_perm: &'b mut [MaybeUninit<u16>],
    in_perm: &'b mut [MaybeUninit<u16>],
    segment_ids: &'b mut [MaybeUninit<u16>],
}

impl<'b> SeqSlots<'b> {
    /// This sequence's output slices, initialised to what a padding cell
    /// holds, with its rows of `fk_adj` and its per-segment tensors.
    #[inline]
    fn init(
        self,
        fk_adj: &'b mut [u8],
        target_pos: &'b mut [u16],
        target_count: &'b mut u8,
        segment_seeds: &'b mut [u32],
    ) -> (SeqOut<'b>, SegOut<'b>) {
        let cells = SeqOut {
            semantic_types: init(self.semantic_types, 0),
            column_ids: init(self.column_ids, 0),
            seq_row_ids: init(self.seq_row_ids, 0),
            numeric_values: init(self.numeric_values, 0.0),
            timestamp_values: init(self.timestamp_values, 0.0),
            bool_values: init(self.bool_values, 0),
            categorical_embed_ids: init(self.categorical_embed_ids, 0),
            text_embed_ids: init(self.text_embed_ids, 0),
            is_null: init(self.is_null, 0),
            is_target: init(self.is_target, 0),
            is_padding: init(self.is_padding, 1),
            fk_adj,
            col_perm: init(self.col_perm, 0),
            out_perm: init(self.out_perm, 0),
            in_perm: init(self.in_perm, 0),
        };
        let segs = SegOut {
            segment_ids: init(self.segment_ids, u16::MAX),
            target_pos,
            target_count,
            segment_seeds,
        };
        (cells, segs)
    }
}

/// Initialise every element of `s` to `v` and view it as initialised.
fn init<T: Copy>(s: &mut [MaybeUninit<T>], v: T) -> &mut [T] {
    s.fill(MaybeUninit::new(v));
    // SAFETY: every element was written just above, and `MaybeUninit<T>`
    // has the layout of `T`.
    unsafe { &mut *(std::ptr::from_mut(s) as *mut [T]) }
}

impl Batch {
    /// A batch whose `[B, S]` tensors are allocated but not initialised
    /// (length 0): [`fill_sequences`](Self::fill_sequences) initialises
    /// and writes them. The other tensors are as in [`Batch::zeroed_packed`].
    pub fn unfilled(b: usize, s: usize, r: usize, k: usize, text_dim: usize) -> Batch {
        let mut batch = Batch::zeroed_packed(0, s, r, k, text_dim);
        let n = b * s;
        batch.batch_size = b;
        batch.semantic_types = Vec::with_capacity(n);
        batch.column_ids = Vec::with_capacity(n);
        batch.seq_row_ids = Vec::with_capacity(n);
        batch.numeric_values = Vec::with_capacity(n);
        batch.timestamp_values = Vec::with_capacity(n * TIMESTAMP_DIM);
        batch.bool_values = Vec::with_capacity(n);
        batch.categorical_embed_ids = Vec::with_capacity(n);
        batch.text_embed_ids = Vec::with_capacity(n);
        batch.is_null = Vec::with_capacity(n);
        batch.is_target = Vec::with_capacity(n);
        batch.is_padding = Vec::with_capacity(n);
        batch.fk_adj = vec![0; b * r * r];
        batch.col_perm = Vec::with_capacity(n);
        batch.out_perm = Vec::with_capacity(n);
        batch.in_perm = Vec::with_capacity(n);
        batch.segment_ids = Vec::with_capacity(n);
        batch.target_pos = vec![0; b * k];
        batch.target_count = vec![0; b];
        batch.segment_seeds = vec![u32::MAX; b * k];
        batch.seq_valid = vec![1; b];
        batch.seq_task_idx = vec![0; b];
        batch.seq_target_stype = vec![0; b];
        batch.seq_cat_emb_start = vec![0; b];
        batch.seq_cat_emb_count = vec![0; b];
        batch.seq_db_idx = vec![0; b];
        batch.is_masked = vec![0; n];
        batch.mask_count = vec![0; b];
        batch
    }

    /// Initialise and write every sequence of an [`unfilled`](Self::unfilled)
    /// batch, in parallel on the current rayon pool (`min_len` sequences per
    /// job at least; `usize::MAX` writes them all on the calling thread):
    /// `f(i, cells, segments)`
    /// writes sequence `i` into its slices (initialised to padding), and
    /// its results are returned in sequence order. The `[B, S]` tensors
    /// have their full length afterwards.
    pub fn fill_sequences<R: Send>(
        &mut self,
        min_len: usize,
        f: impl Fn(usize, &mut SeqOut<'_>, &mut SegOut<'_>) -> R + Sync,
    ) -> Vec<R> {
        let (b, s, r, k) = (self.batch_size, self.seq_len, self.max_rows, self.segments);
        let n = b * s;
        // A batch of zero-length sequences has nothing to split.
        let chunk = s.max(1);
        macro_rules! slots {
            ($v:expr, $w:expr) => {
                $v.spare_capacity_mut()[..n * $w].chunks_mut(chunk * $w)
            };
        }
        let mut a = slots!(self.semantic_types, 1);
        let mut bb = slots!(self.column_ids, 1);
        let mut c = slots!(self.seq_row_ids, 1);
        let mut d = slots!(self.numeric_values, 1);
        let mut e = slots!(self.timestamp_values, TIMESTAMP_DIM);
        let mut ff = slots!(self.bool_values, 1);
        let mut g = slots!(self.categorical_embed_ids, 1);
        let mut h = slots!(self.text_embed_ids, 1);
        let mut i = slots!(self.is_null, 1);
        let mut j = slots!(self.is_target, 1);
        let mut kk = slots!(self.is_padding, 1);
        let mut m = slots!(self.col_perm, 1);
        let mut nn = slots!(self.out_perm, 1);
        let mut o = slots!(self.in_perm, 1);
        let mut sid = slots!(self.segment_ids, 1);
        let mut l = self.fk_adj.chunks_mut((r * r).max(1));
        let mut tp = self.target_pos.chunks_mut(k.max(1));
        let mut tc = self.target_count.iter_mut();
        let mut ss = self.segment_seeds.chunks_mut(k.max(1));
        let work: Vec<_> = (0..b)
            .map(|_| {
                (
                    SeqSlots {
                        semantic_types: a.next().unwrap_or_default(),
                        column_ids: bb.next().unwrap_or_default(),
                        seq_row_ids: c.next().unwrap_or_default(),
                        numeric_values: d.next().unwrap_or_default(),
                        timestamp_values: e.next().unwrap_or_default(),
                        bool_values: ff.next().unwrap_or_default(),
                        categorical_embed_ids: g.next().unwrap_or_default(),
                        text_embed_ids: h.next().unwrap_or_default(),
                        is_null: i.next().unwrap_or_default(),
                        is_target: j.next().unwrap_or_default(),
                        is_padding: kk.next().unwrap_or_default(),
                        col_perm: m.next().unwrap_or_default(),
                        out_perm: nn.next().unwrap_or_default(),
                        in_perm: o.next().unwrap_or_default(),
                        segment_ids: sid.next().unwrap_or_default(),
                    },
                    if r == 0 {
                        Default::default()
                    } else {
                        l.next().unwrap_or_default()
                    },
                    tp.next().unwrap_or_default(),
                    tc.next().expect("one target count per sequence"),
                    ss.next().unwrap_or_default(),
                )
            })
            .collect();
        let results = work
            .into_par_iter()
            .with_min_len(min_len)
            .enumerate()
            .map(
                |(idx, (x, fk_adj, target_pos, target_count, segment_seeds))| {
                    let (mut cells, mut segs) =
                        x.init(fk_adj, target_pos, target_count, segment_seeds);
                    f(idx, &mut cells, &mut segs)
                },
            )
            .collect();
        // SAFETY: every element of the `[B, S]` tensors' capacity was
        // initialised above (see `set_filled_len`).
        unsafe { self.set_filled_len(n) };
        results
    }

    /// Set the `[B, S]` tensors' lengths to `n` (`n · 15` for the
    /// timestamps) once [`fill_sequences`](Self::fill_sequences) has
    /// initialised their whole capacity.
    ///
    /// # Safety
    ///
    /// Call only when the `[B, S]` tensors were allocated with capacity `n`
    /// (`n · 15` for the timestamps) by `unfilled`, and every element
    /// of that capacity was initialised above: the chunks cover it
    /// exactly (B chunks of S) and each was passed through `init`. A
    /// panic in `f` propagates out of the `collect` before this point,
    /// leaving the lengths at 0.
    unsafe fn set_filled_len(&mut self, n: usize) {
        unsafe {
            self.semantic_types.set_len(n);
            self.column_ids.set_len(n);
            self.seq_row_ids.set_len(n);
            self.numeric_values.set_len(n);
            self.timestamp_values.set_len(n * TIMESTAMP_DIM);
            self.bool_values.set_len(n);
            self.categorical_embed_ids.set_len(n);
            self.text_embed_ids.set_len(n);
            self.is_null.set_len(n);
            self.is_target.set_len(n);
            self.is_padding.set_len(n);
            self.col_perm.set_len(n);
            self.out_perm.set_len(n);
            self.in_perm.set_len(n);
            self.segment_ids.set_len(n);
        }
    }
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
    /// their own: what `assemble_sequence` writes one segment into.
    pub(super) fn segment(
        &mut self,
        off: usize,
        len: usize,
        row_off: usize,
        r: usize,
    ) -> SeqOut<'_> {
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
