//! Writing one sequence's cells, adjacency and permutations; text collation.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use half::f16;

use super::pack::SegOut;
use super::perm::{rcm_order, RcmScratch};
use super::timestamp::{encode_timestamp, TIMESTAMP_DIM};
use super::{Batch, SeqStats};
use crate::format::{bit, ColumnValues, ColumnView, GraphView};
use crate::sampler::Subgraph;

/// The stored columns of one table with their cell type codes.
pub struct TableCells<'a> {
    /// Global index of the table's first row.
    pub row_offset: u32,
    /// The table's stored columns.
    pub columns: Vec<ColumnView<'a>>,
    /// Semantic type code of each stored column.
    pub codes: Vec<i8>,
}

/// The task's target cell.
#[derive(Clone, Copy)]
pub enum Target<'a> {
    /// A stored column of the anchor table (cell task): `slot` in the table.
    Cell {
        /// Slot of the target column among the table's stored columns.
        slot: usize,
    },
    /// A virtual column: values from the task file.
    Virtual {
        /// Global column index of the target.
        column_idx: u32,
        /// Semantic type code of the target.
        code: i8,
        /// Target value per seed.
        values: ColumnValues<'a>,
        /// Validity bitmap of the targets.
        validity: &'a [u8],
    },
}

/// Everything a worker needs to write sequences of one batch.
pub struct SeqContext<'a> {
    /// The database graph.
    pub graph: GraphView<'a>,
    /// Every table's cells.
    pub tables: &'a [TableCells<'a>],
    /// Mean of all timestamps (µs), for the encoding.
    pub ts_mean: f64,
    /// Standard deviation of all timestamps (µs).
    pub ts_std: f64,
    /// Where the task's target comes from.
    pub target: Target<'a>,
    /// Rows of `categorical_embeddings.bin`: a larger stored id (a corrupt
    /// payload; payloads are not hashed at open) reads as a null cell.
    pub num_categorical: u32,
    /// Rows of `text_embeddings.bin` (likewise).
    pub num_text: u32,
    /// Added to every column id: the database's first column in the
    /// mixture's concatenated column table (0 for one database).
    pub column_offset: u32,
    /// Added to every categorical id (the database's first category in the
    /// concatenated categorical table).
    pub categorical_offset: u32,
}

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

impl Batch {
    /// Split every tensor into per-sequence slices: the cell tensors and
    /// the per-segment tensors of each sequence.
    pub fn sequences(&mut self) -> Vec<(SeqOut<'_>, SegOut<'_>)> {
        let (s, r, k) = (self.seq_len, self.max_rows, self.segments);
        let mut a = self.semantic_types.chunks_mut(s);
        let mut b = self.column_ids.chunks_mut(s);
        let mut c = self.seq_row_ids.chunks_mut(s);
        let mut d = self.numeric_values.chunks_mut(s);
        let mut e = self.timestamp_values.chunks_mut(s * TIMESTAMP_DIM);
        let mut f = self.bool_values.chunks_mut(s);
        let mut g = self.categorical_embed_ids.chunks_mut(s);
        let mut h = self.text_embed_ids.chunks_mut(s);
        let mut i = self.is_null.chunks_mut(s);
        let mut j = self.is_target.chunks_mut(s);
        let mut kk = self.is_padding.chunks_mut(s);
        let mut l = self.fk_adj.chunks_mut((r * r).max(1));
        let mut m = self.col_perm.chunks_mut(s);
        let mut n = self.out_perm.chunks_mut(s);
        let mut o = self.in_perm.chunks_mut(s);
        let mut sid = self.segment_ids.chunks_mut(s);
        let mut tp = self.target_pos.chunks_mut(k);
        let mut tc = self.target_count.iter_mut();
        let mut ss = self.segment_seeds.chunks_mut(k);
        (0..self.batch_size)
            .map(|_| {
                (
                    SeqOut {
                        semantic_types: a.next().unwrap(),
                        column_ids: b.next().unwrap(),
                        seq_row_ids: c.next().unwrap(),
                        numeric_values: d.next().unwrap(),
                        timestamp_values: e.next().unwrap(),
                        bool_values: f.next().unwrap(),
                        categorical_embed_ids: g.next().unwrap(),
                        text_embed_ids: h.next().unwrap(),
                        is_null: i.next().unwrap(),
                        is_target: j.next().unwrap(),
                        is_padding: kk.next().unwrap(),
                        fk_adj: if r == 0 { &mut [] } else { l.next().unwrap() },
                        col_perm: m.next().unwrap(),
                        out_perm: n.next().unwrap(),
                        in_perm: o.next().unwrap(),
                    },
                    SegOut {
                        segment_ids: sid.next().unwrap(),
                        target_pos: tp.next().unwrap(),
                        target_count: tc.next().unwrap(),
                        segment_seeds: ss.next().unwrap(),
                    },
                )
            })
            .collect()
    }
}

/// Per-worker buffers for assembly.
#[derive(Debug, Default)]
pub struct AssembleScratch {
    keys: Vec<u64>,
    row_start: Vec<u32>,
    order: Vec<u16>,
    rcm: RcmScratch,
}

#[inline]
#[allow(clippy::too_many_arguments)]
fn write_value(
    o: &mut SeqOut<'_>,
    pos: usize,
    code: i8,
    column_idx: u32,
    row_local: u16,
    values: ColumnValues<'_>,
    valid: bool,
    idx: usize,
    ctx: &SeqContext<'_>,
) {
    o.semantic_types[pos] = code;
    o.column_ids[pos] = (column_idx + ctx.column_offset) as i32;
    o.seq_row_ids[pos] = row_local;
    o.is_padding[pos] = 0;
    if !valid {
        o.is_null[pos] = 1;
        return;
    }
    match values {
        ColumnValues::Numerical(v) => o.numeric_values[pos] = v[idx],
        ColumnValues::Boolean(v) => o.bool_values[pos] = v[idx],
        ColumnValues::Timestamp(v) => encode_timestamp(
            v[idx],
            ctx.ts_mean,
            ctx.ts_std,
            &mut o.timestamp_values[pos * TIMESTAMP_DIM..(pos + 1) * TIMESTAMP_DIM],
        ),
        ColumnValues::Categorical(v) if v[idx] < ctx.num_categorical => {
            o.categorical_embed_ids[pos] = v[idx] + ctx.categorical_offset;
        }
        ColumnValues::Text(v) if v[idx] < ctx.num_text => o.text_embed_ids[pos] = v[idx],
        ColumnValues::Categorical(_) | ColumnValues::Text(_) => o.is_null[pos] = 1,
    }
}

/// Ask the CPU to start loading a row's cells (one line per column array
/// and its validity bitmap): rows are scattered over column-major tables, so
/// without this every cell is a cache miss taken one after another.
#[inline]
fn prefetch_row(ctx: &SeqContext<'_>, row: u32) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let tc = &ctx.tables[ctx.graph.row_table[row as usize] as usize];
        let r = (row - tc.row_offset) as usize;
        for c in &tc.columns {
            let p: *const i8 = match c.values {
                ColumnValues::Numerical(v) => v[r..].as_ptr().cast(),
                ColumnValues::Boolean(v) => v[r..].as_ptr().cast(),
                ColumnValues::Timestamp(v) => v[r..].as_ptr().cast(),
                ColumnValues::Categorical(v) | ColumnValues::Text(v) => v[r..].as_ptr().cast(),
            };
            // SAFETY: prefetch is a hint; both addresses are inside live slices.
            unsafe {
                _mm_prefetch(p, _MM_HINT_T0);
                _mm_prefetch(c.validity[r >> 3..].as_ptr().cast(), _MM_HINT_T0);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ctx, row);
}

/// Write one sequence: cells of `sub` (seed row first, target cell first),
/// `fk_adj` (`r` = the batch's max rows), and the three permutations.
/// `seed_pos` indexes the task's seed list (for a virtual target's value).
pub fn assemble_sequence(
    ctx: &SeqContext<'_>,
    sub: &Subgraph,
    seed_pos: usize,
    r: usize,
    o: &mut SeqOut<'_>,
    s: &mut AssembleScratch,
) -> SeqStats {
    const AHEAD: usize = 2;
    let seq_len = o.semantic_types.len();
    let g = &ctx.graph;
    let mut pos = 0usize;
    s.row_start.clear();
    for &row in sub.rows.iter().take(AHEAD) {
        prefetch_row(ctx, row);
    }
    for (i, &row) in sub.rows.iter().enumerate() {
        if let Some(&next) = sub.rows.get(i + AHEAD) {
            prefetch_row(ctx, next);
        }
        s.row_start.push(pos as u32);
        let t = g.row_table[row as usize] as usize;
        let tc = &ctx.tables[t];
        let local_row = (row - tc.row_offset) as usize;
        let mut skip_slot = usize::MAX;
        if i == 0 {
            // The target cell leads the seed row.
            match ctx.target {
                Target::Cell { slot } => {
                    let c = &tc.columns[slot];
                    write_value(
                        o,
                        0,
                        tc.codes[slot],
                        c.column_idx,
                        0,
                        c.values,
                        c.is_valid(local_row),
                        local_row,
                        ctx,
                    );
                    skip_slot = slot;
                }
                Target::Virtual {
                    column_idx,
                    code,
                    values,
                    validity,
                } => {
                    write_value(
                        o,
                        0,
                        code,
                        column_idx,
                        0,
                        values,
                        bit(validity, seed_pos),
                        seed_pos,
                        ctx,
                    );
                }
            }
            o.is_target[0] = 1;
            pos = 1;
        }
        for (j, c) in tc.columns.iter().enumerate() {
            if j == skip_slot {
                continue;
            }
            if pos >= seq_len {
                break;
            }
            write_value(
                o,
                pos,
                tc.codes[j],
                c.column_idx,
                i as u16,
                c.values,
                c.is_valid(local_row),
                local_row,
                ctx,
            );
            pos += 1;
        }
    }
    s.row_start.push(pos as u32);
    let cells = pos;
    for &(c, p) in &sub.edges {
        o.fk_adj[c as usize * r + p as usize] = 1;
    }
    // col_perm: by column, then position; padding last.
    s.keys.clear();
    s.keys
        .extend((0..cells).map(|p| ((o.column_ids[p] as u32 as u64) << 16) | p as u64));
    s.keys.sort_unstable();
    for (k, key) in s.keys.iter().enumerate() {
        o.col_perm[k] = (*key & 0xffff) as u16;
    }
    for (p, slot) in o.col_perm.iter_mut().enumerate().skip(cells) {
        *slot = p as u16;
    }
    for (outbound, perm) in [(true, &mut *o.out_perm), (false, &mut *o.in_perm)] {
        rcm_order(
            sub.rows.len(),
            &sub.edges,
            outbound,
            &mut s.order,
            &mut s.rcm,
        );
        let mut k = 0;
        for &row in &s.order {
            for p in s.row_start[row as usize]..s.row_start[row as usize + 1] {
                perm[k] = p as u16;
                k += 1;
            }
        }
        for (p, slot) in perm.iter_mut().enumerate().skip(cells) {
            *slot = p as u16;
        }
    }
    SeqStats {
        depth: sub.max_depth,
        rows: sub.rows.len() as u32,
        cells: cells as u32,
        cells_dropped: sub.cells_dropped,
        children_capped: sub.children_capped,
        temporal_filtered: sub.temporal_filtered,
        temporal_leaks: sub.temporal_leaks,
        segments: 1,
        contexts_cut: 0,
    }
}

/// FxHash: a fast non-cryptographic hasher for small integer keys.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map with [`FxHasher`].
pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Replace global text ids by batch-local ones (first-seen order) and gather
/// each distinct text embedding once. The batch's only serial phase.
#[allow(clippy::implicit_hasher)] // FxMap is the one hasher used here
pub fn collate_text(batch: &mut Batch, text_emb: &[f16], dim: usize, map: &mut FxMap<u32, u32>) {
    map.clear();
    let mut order: Vec<u32> = Vec::new();
    for p in 0..batch.semantic_types.len() {
        if batch.semantic_types[p] == 4 && batch.is_null[p] == 0 && batch.is_padding[p] == 0 {
            let g = batch.text_embed_ids[p];
            let next = order.len() as u32;
            let local = *map.entry(g).or_insert_with(|| {
                order.push(g);
                next
            });
            batch.text_embed_ids[p] = local;
        }
    }
    let mut out = Vec::with_capacity(order.len() * dim);
    for &g in &order {
        // Ids were range-checked at assembly; a short matrix still gives
        // zeros rather than an out-of-bounds read.
        match text_emb.get(g as usize * dim..(g as usize + 1) * dim) {
            Some(e) => out.extend_from_slice(e),
            None => out.resize(out.len() + dim, f16::ZERO),
        }
    }
    batch.num_text = order.len();
    batch.text_batch_embeddings = out;
}
