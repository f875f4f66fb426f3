//! Writing one sequence's cells, adjacency and permutations; text collation.

use half::f16;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::perm::{rcm_orders, RcmScratch};
use super::slots::SeqOut;
use super::timestamp::{TimestampMemo, TIMESTAMP_DIM};
use super::Batch;
use crate::context::{LabelTimes, Subgraph};
use crate::format::{bit, ColumnValues, ColumnView, EmbeddingRows, GraphView};
use crate::prefetch::prefetch;
use crate::readings::SeqReadings;

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

/// A cell task's label cells (`crate::context::labels`): shown on a row of
/// the anchor table only once its label was known at the seed's time.
#[derive(Clone)]
pub struct LabelCells<'a> {
    /// The anchor table.
    pub table: usize,
    /// Slots of the label cells in the anchor table (the target, the
    /// task's `label_columns` and its `label_time_column`).
    pub slots: Vec<usize>,
    /// When each row's label becomes known.
    pub times: LabelTimes<'a>,
    /// Write a label not yet known as a null cell (off: the diagnostic
    /// `temporal_filter = false`, under which `label_leaks` counts it).
    pub hide: bool,
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
    /// A cell task's label cells (`None`: a virtual target).
    pub labels: Option<LabelCells<'a>>,
    /// Each seed's observation time (`i64::MAX`: none), by seed position.
    pub obs_times: &'a [i64],
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

/// Per-worker buffers for assembly.
#[derive(Debug, Default)]
pub struct AssembleScratch {
    keys: Vec<u64>,
    row_start: Vec<u32>,
    /// Column counts of the counting sort behind `col_perm`.
    column_counts: Vec<u32>,
    order: Vec<u16>,
    order_in: Vec<u16>,
    rcm: RcmScratch,
    timestamps: TimestampMemo,
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
    memo: &mut TimestampMemo,
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
        ColumnValues::Timestamp(v) => memo.encode(
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
fn prefetch_row(ctx: &SeqContext<'_>, table: u16, row: u32) {
    let Some(tc) = ctx.tables.get(table as usize) else {
        return;
    };
    let r = row.wrapping_sub(tc.row_offset) as usize;
    for c in &tc.columns {
        match c.values {
            ColumnValues::Numerical(v) => prefetch(v, r),
            ColumnValues::Boolean(v) => prefetch(v, r),
            ColumnValues::Timestamp(v) => prefetch(v, r),
            ColumnValues::Categorical(v) | ColumnValues::Text(v) => prefetch(v, r),
        }
        if !c.all_valid {
            prefetch(c.validity, r >> 3);
        }
    }
}

/// Write one sequence: cells of `sub` (seed row first, target cell first),
/// `fk_adj` (`r` = the batch's max rows), and the three permutations.
/// `seed_pos` indexes the task's seed list (for a virtual target's value).
#[inline]
pub fn assemble_sequence(
    ctx: &SeqContext<'_>,
    sub: &Subgraph,
    seed_pos: usize,
    r: usize,
    o: &mut SeqOut<'_>,
    s: &mut AssembleScratch,
) -> SeqReadings {
    let (cells, label_leaks) = write_cells(ctx, sub, seed_pos, o, s);
    for &(c, p) in &sub.edges {
        o.fk_adj[c as usize * r + p as usize] = 1;
    }
    write_permutations(sub, cells, o, s);
    SeqReadings {
        depth: sub.max_depth,
        rows: sub.rows.len() as u32,
        cells: cells as u32,
        cells_dropped: sub.cells_dropped,
        children_capped: sub.children_capped,
        temporal_filtered: sub.temporal_filtered,
        temporal_leaks: sub.temporal_leaks,
        label_leaks,
        segments: 1,
        contexts_cut: 0,
        tier_cells: sub.tier_cells,
        examples: sub.example_rows.len() as u32,
        walk_steps: sub.walk_steps,
        deadline_hits: sub.deadline_hits,
        store_misses: sub.store_misses,
        masked_cells: 0,
        // Tier 0 is non-empty exactly when the context was built in-context.
        no_examples: u32::from(
            sub.tier_cells[0] > 0 && sub.example_rows.is_empty() && sub.deadline_hits == 0,
        ),
    }
}

/// Write the cells of `sub`'s rows in order (the seed row first, led by its
/// target cell) until the sequence is full; records each row's first
/// position in `s.row_start`. A label cell of a row whose label was not
/// known at the seed's time (the seed's own always) is written null, or,
/// not hidden, counted. Returns the cells written and that count.
#[inline(always)]
fn write_cells(
    ctx: &SeqContext<'_>,
    sub: &Subgraph,
    seed_pos: usize,
    o: &mut SeqOut<'_>,
    s: &mut AssembleScratch,
) -> (usize, u64) {
    const AHEAD: usize = 2;
    let seq_len = o.semantic_types.len();
    let (mut pos, mut leaks) = (0usize, 0u64);
    let obs = obs_time(ctx, seed_pos);
    let hide = ctx.labels.as_ref().is_some_and(|l| l.hide);
    s.row_start.clear();
    for (&row, &t) in sub.rows.iter().zip(&sub.tables).take(AHEAD) {
        prefetch_row(ctx, t, row);
    }
    for (i, (&row, &t)) in sub.rows.iter().zip(&sub.tables).enumerate() {
        if let (Some(&next), Some(&tn)) = (sub.rows.get(i + AHEAD), sub.tables.get(i + AHEAD)) {
            prefetch_row(ctx, tn, next);
        }
        s.row_start.push(pos as u32);
        let tc = &ctx.tables[t as usize];
        let local_row = (row - tc.row_offset) as usize;
        let mut skip_slot = usize::MAX;
        if i == 0 {
            skip_slot = write_target(ctx, tc, local_row, seed_pos, o, s);
            pos = 1;
        }
        // The label cells of this row not known at the seed's time.
        let unknown: &[usize] = match &ctx.labels {
            Some(l)
                if l.table == usize::from(t)
                    && (i == 0 || !l.times.known(&ctx.graph, row, obs)) =>
            {
                &l.slots
            }
            _ => &[],
        };
        for (j, c) in tc.columns.iter().enumerate() {
            if j == skip_slot {
                continue;
            }
            if pos >= seq_len {
                break;
            }
            let mut valid = c.read(local_row);
            if valid && !unknown.is_empty() && unknown.contains(&j) {
                if hide {
                    valid = false;
                } else {
                    leaks += 1;
                }
            }
            write_value(
                o,
                pos,
                tc.codes[j],
                c.column_idx,
                i as u16,
                c.values,
                valid,
                local_row,
                ctx,
                &mut s.timestamps,
            );
            pos += 1;
        }
    }
    s.row_start.push(pos as u32);
    (pos, leaks)
}

/// The observation time of the seed at `seed_pos` (`i64::MAX`: none).
#[inline]
fn obs_time(ctx: &SeqContext<'_>, seed_pos: usize) -> i64 {
    ctx.obs_times.get(seed_pos).copied().unwrap_or(i64::MAX)
}

/// Write the target cell at position 0 (the seed row's `local_row` of table
/// cells `tc`, or the task's value at `seed_pos` for a virtual target) and
/// mark it; returns the column slot it took from the row (`usize::MAX`:
/// none, a virtual target).
#[inline]
fn write_target(
    ctx: &SeqContext<'_>,
    tc: &TableCells<'_>,
    local_row: usize,
    seed_pos: usize,
    o: &mut SeqOut<'_>,
    s: &mut AssembleScratch,
) -> usize {
    let skip_slot = match ctx.target {
        Target::Cell { slot } => {
            let c = &tc.columns[slot];
            let valid = c.read(local_row);
            let (code, idx) = (tc.codes[slot], c.column_idx);
            write_value(
                o,
                0,
                code,
                idx,
                0,
                c.values,
                valid,
                local_row,
                ctx,
                &mut s.timestamps,
            );
            slot
        }
        Target::Virtual {
            column_idx,
            code,
            values,
            validity,
        } => {
            let valid = bit(validity, seed_pos);
            write_value(
                o,
                0,
                code,
                column_idx,
                0,
                values,
                valid,
                seed_pos,
                ctx,
                &mut s.timestamps,
            );
            usize::MAX
        }
    };
    o.is_target[0] = 1;
    skip_slot
}

/// `col_perm` (by column, then position) and the outbound / inbound RCM
/// row orders of the first `cells` positions; padding keeps its place.
#[inline]
fn write_permutations(sub: &Subgraph, cells: usize, o: &mut SeqOut<'_>, s: &mut AssembleScratch) {
    column_order(&o.column_ids[..cells], &mut o.col_perm[..cells], s);
    for (p, slot) in o.col_perm.iter_mut().enumerate().skip(cells) {
        *slot = p as u16;
    }
    rcm_orders(
        sub.rows.len(),
        &sub.edges,
        &mut s.order,
        &mut s.order_in,
        &mut s.rcm,
    );
    for (order, perm) in [(&s.order, &mut *o.out_perm), (&s.order_in, &mut *o.in_perm)] {
        let mut k = 0;
        for &row in order {
            for p in s.row_start[row as usize]..s.row_start[row as usize + 1] {
                perm[k] = p as u16;
                k += 1;
            }
        }
        for (p, slot) in perm.iter_mut().enumerate().skip(cells) {
            *slot = p as u16;
        }
    }
}

/// Write to `perm` the positions of `column_ids` ordered by (column id,
/// position). The ids of one sequence span a few hundred values (one
/// database's columns), so a counting sort by id (stable: positions stay
/// ascending within a column) replaces a comparison sort; a span too wide
/// for a small count table falls back to sorting (column, position) keys.
fn column_order(column_ids: &[i32], perm: &mut [u16], s: &mut AssembleScratch) {
    const MAX_SPAN: u32 = 1 << 12;
    let ids = || column_ids.iter().map(|&c| c as u32);
    let (lo, hi) = ids().fold((u32::MAX, 0), |(lo, hi), c| (lo.min(c), hi.max(c)));
    if column_ids.is_empty() || hi - lo >= MAX_SPAN {
        s.keys.clear();
        s.keys.extend(
            ids()
                .enumerate()
                .map(|(p, c)| (u64::from(c) << 16) | p as u64),
        );
        s.keys.sort_unstable();
        for (slot, key) in perm.iter_mut().zip(&s.keys) {
            *slot = (*key & 0xffff) as u16;
        }
        return;
    }
    let start = &mut s.column_counts;
    start.clear();
    start.resize((hi - lo) as usize + 2, 0);
    for c in ids() {
        start[(c - lo) as usize + 1] += 1;
    }
    for i in 1..start.len() {
        start[i] += start[i - 1];
    }
    for (p, c) in ids().enumerate() {
        let slot = &mut start[(c - lo) as usize];
        perm[*slot as usize] = p as u16;
        *slot += 1;
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
pub fn collate_text(batch: &mut Batch, text_emb: EmbeddingRows<'_>, map: &mut FxMap<u32, u32>) {
    let dim = text_emb.dim;
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
        match text_emb.row(g as usize) {
            Some(e) => out.extend_from_slice(e),
            None => out.resize(out.len() + dim, f16::ZERO),
        }
    }
    batch.num_text = order.len();
    batch.text_batch_embeddings = out;
}

/// [`collate_text`] for a batch whose sequences come from several
/// databases: sequence `q`'s text ids are ids of database `seq_db[q]`,
/// whose embeddings are `text_emb[seq_db[q]]`; a text is shared only
/// within its database.
#[allow(clippy::implicit_hasher)] // FxMap is the one hasher used here
pub fn collate_text_mixed(
    batch: &mut Batch,
    text_emb: &[EmbeddingRows<'_>],
    seq_db: &[u32],
    map: &mut FxMap<u64, u32>,
) {
    let dim = text_emb.first().map_or(batch.text_dim, |e| e.dim);
    let s = batch.seq_len;
    map.clear();
    let mut order: Vec<(u32, u32)> = Vec::new();
    for p in 0..batch.semantic_types.len() {
        if batch.semantic_types[p] == 4 && batch.is_null[p] == 0 && batch.is_padding[p] == 0 {
            let (d, g) = (seq_db[p / s], batch.text_embed_ids[p]);
            let next = order.len() as u32;
            let local = *map
                .entry(u64::from(d) << 32 | u64::from(g))
                .or_insert_with(|| {
                    order.push((d, g));
                    next
                });
            batch.text_embed_ids[p] = local;
        }
    }
    let mut out = Vec::with_capacity(order.len() * dim);
    for &(d, g) in &order {
        match text_emb.get(d as usize).and_then(|e| e.row(g as usize)) {
            Some(e) => out.extend_from_slice(e),
            None => out.resize(out.len() + dim, f16::ZERO),
        }
    }
    batch.num_text = order.len();
    batch.text_batch_embeddings = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_collation_keeps_each_databases_texts_apart() {
        // Two sequences of 3 cells, sequence 0 from database 0 and sequence
        // 1 from database 1; text id 1 exists in both with different
        // embeddings, text id 0 twice in database 0.
        let e0: Vec<f16> = [1.0, 2.0, 3.0, 4.0].map(f16::from_f32).to_vec();
        let e1: Vec<f16> = [5.0, 6.0, 7.0, 8.0].map(f16::from_f32).to_vec();
        let rows = [
            EmbeddingRows::unchecked(&e0, 2),
            EmbeddingRows::unchecked(&e1, 2),
        ];
        let mut b = Batch::zeroed(2, 3, 1, 2);
        b.semantic_types = vec![4, 4, 4, 4, 0, 4];
        b.text_embed_ids = vec![1, 0, 0, 1, 0, 0];
        b.is_padding = vec![0; 6];
        let mut map = FxMap::default();
        collate_text_mixed(&mut b, &rows, &[0, 1], &mut map);
        assert_eq!(b.num_text, 4, "db0:1, db0:0, db1:1, db1:0");
        assert_eq!(b.text_embed_ids, vec![0, 1, 1, 2, 0, 3]);
        let got: Vec<f32> = b.text_batch_embeddings.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, vec![3.0, 4.0, 1.0, 2.0, 7.0, 8.0, 5.0, 6.0]);
        // One database: the same result as the one-database collation.
        let mut a = Batch::zeroed(2, 3, 1, 2);
        a.semantic_types = vec![4, 4, 4, 4, 0, 4];
        a.text_embed_ids = vec![1, 0, 0, 1, 0, 0];
        a.is_padding = vec![0; 6];
        let mut one = a.clone();
        collate_text_mixed(&mut a, &rows[..1], &[0, 0], &mut map);
        collate_text(&mut one, rows[0], &mut FxMap::default());
        assert_eq!(a.text_embed_ids, one.text_embed_ids);
        assert_eq!(a.text_batch_embeddings, one.text_batch_embeddings);
    }

    #[test]
    fn column_order_is_the_column_then_position_sort() {
        let mut rng = crate::rng::Xoshiro256pp::seed_from_u64(8);
        let mut s = AssembleScratch::default();
        // Narrow spans take the counting sort, wide ones the fallback.
        for span in [1u64, 7, 300, 4095, 4096, 1 << 20] {
            for _ in 0..20 {
                let n = rng.below(1024) as usize;
                let base = rng.below(1 << 24);
                let ids: Vec<i32> = (0..n).map(|_| (base + rng.below(span)) as i32).collect();
                let mut perm = vec![0u16; n];
                column_order(&ids, &mut perm, &mut s);
                let mut want: Vec<u16> = (0..n as u16).collect();
                want.sort_by_key(|&p| (ids[p as usize], p));
                assert_eq!(perm, want, "span {span}");
            }
        }
    }
}
