//! Writing one sequence's cells, adjacency and permutations (text
//! collation is `collate.rs`'s).

use super::perm::{rcm_orders, RcmScratch};
use super::slots::SeqOut;
use super::timestamp::{TimestampMemo, TIMESTAMP_DIM};
use crate::context::{LabelTimes, Subgraph};
use crate::format::{bit, ColumnValues, ColumnView, GraphView};
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
    /// A forecast task's label window Δ (µs), if declared: an example
    /// item's label shown while its window was open at the seed's time
    /// (observation + Δ > the seed's) is counted in `label_leaks`.
    pub window: Option<i64>,
    /// A link task: count the example labels shown that are positive
    /// (`SeqReadings::positive_examples`).
    pub count_positives: bool,
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
    let (cells, label_leaks, positive_examples) = write_cells(ctx, sub, seed_pos, o, s);
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
        positive_examples,
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
/// not hidden, counted. Returns the cells written, that count and the
/// positive example labels written (link tasks).
#[inline(always)]
fn write_cells(
    ctx: &SeqContext<'_>,
    sub: &Subgraph,
    seed_pos: usize,
    o: &mut SeqOut<'_>,
    s: &mut AssembleScratch,
) -> (usize, u64, u32) {
    const AHEAD: usize = 2;
    let seq_len = o.semantic_types.len();
    let (mut pos, mut leaks, mut positives) = (0usize, 0u64, 0u32);
    let obs = obs_time(ctx, seed_pos);
    let hide = ctx.labels.as_ref().is_some_and(|l| l.hide);
    s.row_start.clear();
    let mut items = sub.example_items.iter().peekable();
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
        } else if let Some(&(_, j)) = items.next_if(|e| usize::from(e.0) == i) {
            if pos < seq_len {
                let (leak, positive) = write_item(ctx, j, i, obs, pos, o, s);
                leaks += leak;
                positives += positive;
                pos += 1;
            }
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
    (pos, leaks, positives)
}

/// Write forecast item `j`'s label, visible (not a target), at `pos` as
/// the first cell of its anchor row (local row `i`); returns (1 if its
/// window was still open at the seed's time `obs` (a label leak, counted
/// from the item's own time whatever chose it), 1 if it is a link task's
/// positive label).
#[inline]
fn write_item(
    ctx: &SeqContext<'_>,
    j: u32,
    i: usize,
    obs: i64,
    pos: usize,
    o: &mut SeqOut<'_>,
    s: &mut AssembleScratch,
) -> (u64, u32) {
    let Target::Virtual {
        column_idx,
        code,
        values,
        validity,
    } = ctx.target
    else {
        return (0, 0);
    };
    let j = j as usize;
    let valid = bit(validity, j);
    write_value(
        o,
        pos,
        code,
        column_idx,
        i as u16,
        values,
        valid,
        j,
        ctx,
        &mut s.timestamps,
    );
    let known = ctx.obs_times[j].saturating_add(ctx.window.unwrap_or(0));
    let positive =
        ctx.count_positives && valid && matches!(values, ColumnValues::Boolean(v) if v[j] != 0);
    (u64::from(valid && known > obs), u32::from(positive))
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

#[cfg(test)]
mod tests {
    use super::*;

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
