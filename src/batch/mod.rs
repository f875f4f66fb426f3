//! Subgraphs → the batch tensors of the batch layout (docs/sampling.md).
//!
//! Layout per sequence: the rows of the subgraph in BFS order, each row's
//! cells in table column order; the seed row first, led by its target cell.
//! Positions past the last cell are padding (`is_padding = 1`, zeros
//! elsewhere). `fk_adj[b, i, j] = 1` iff included row `i` references included
//! row `j` (child → parent). `col_perm` orders positions by column, padding
//! last; `out_perm` / `in_perm` order rows by reverse Cuthill–McKee over the
//! outbound / inbound row graph (cells of a row stay together), padding last.
//! Text cells hold batch-local indices into `text_batch_embeddings`, which
//! holds each distinct text value of the batch once.
//!
//! With `pack` a sequence holds several seeds' contexts (segments) and the
//! rules above hold per segment: the layout, the per-segment tensors
//! (`segment_ids`, `target_pos`, `target_count`, `segment_seeds`) and what
//! "intact" means are the module doc of `pack.rs`. Without `pack` every
//! sequence is one segment (`K = 1`) and the layout is the seed design's.
//!
//! Invariant: every tensor is freshly allocated per batch and handed over
//! whole (to NumPy without a copy); nothing here keeps a reference to it.

mod assemble;
mod collate;
mod pack;
mod perm;
mod slots;
mod tensors;
mod timestamp;

pub use assemble::{
    assemble_sequence, AssembleScratch, LabelCells, SeqContext, TableCells, Target,
};
pub use collate::{collate_text, collate_text_mixed, FxHasher, FxMap};
pub use pack::{assemble_packed_sequence, auto_count, pack_contexts, PackPlan, PADDING_GOAL};
pub use perm::rcm_order;
pub use slots::{SegOut, SeqOut};
pub use tensors::{batch_bytes, batch_keys, Dtype, Shape, TensorData, TensorSpec, TENSORS};
pub use timestamp::{encode_timestamp, TIMESTAMP_DIM};

use half::f16;

/// One batch: every tensor as a flat row-major buffer plus its shape.
#[derive(Debug, Clone)]
pub struct Batch {
    /// B: sequences.
    pub batch_size: usize,
    /// S: cells per sequence.
    pub seq_len: usize,
    /// R: the most rows of any sequence in the batch.
    pub max_rows: usize,
    /// U: distinct text values in the batch.
    pub num_text: usize,
    /// D: text embedding width.
    pub text_dim: usize,
    /// K: segments per sequence at most (`SamplerConfig::max_segments`).
    pub segments: usize,
    /// `[B, S]` semantic type code per cell (-1 padding).
    pub semantic_types: Vec<i8>,
    /// `[B, S]` global column index per cell.
    pub column_ids: Vec<i32>,
    /// `[B, S]` row of the cell within its sequence (BFS order).
    pub seq_row_ids: Vec<u16>,
    /// `[B, S]` z-scored number of numerical cells.
    pub numeric_values: Vec<f32>,
    /// `[B, S, TIMESTAMP_DIM]` encoded time of timestamp cells.
    pub timestamp_values: Vec<f32>,
    /// `[B, S]` 0/1 of boolean cells.
    pub bool_values: Vec<u8>,
    /// `[B, S]` global category embedding id of categorical cells.
    pub categorical_embed_ids: Vec<u32>,
    /// `[B, S]` batch-local text index of text cells (after collation).
    pub text_embed_ids: Vec<u32>,
    /// `[B, S]` 1 where the cell's value is null.
    pub is_null: Vec<u8>,
    /// `[B, S]` 1 at the seed's target cell.
    pub is_target: Vec<u8>,
    /// `[B, S]` 1 past the sequence's last cell.
    pub is_padding: Vec<u8>,
    /// `[B, R, R]` 1 where included row `i` references included row `j`.
    pub fk_adj: Vec<u8>,
    /// `[B, S]` positions ordered by column, padding last.
    pub col_perm: Vec<u16>,
    /// `[B, S]` positions in reverse Cuthill–McKee order of the outbound row graph.
    pub out_perm: Vec<u16>,
    /// `[B, S]` positions in reverse Cuthill–McKee order of the inbound row graph.
    pub in_perm: Vec<u16>,
    /// `[B, S]` segment of each cell within its sequence (`u16::MAX` on padding).
    pub segment_ids: Vec<u16>,
    /// `[B, K]` position of each segment's target cell (0 past `target_count`).
    pub target_pos: Vec<u16>,
    /// `[B]` segments (targets) in each sequence.
    pub target_count: Vec<u8>,
    /// `[B, K]` each segment's seed, as a position in the task's seed list
    /// (`u32::MAX` past `target_count`).
    pub segment_seeds: Vec<u32>,
    /// `[U, D]` each distinct text value of the batch, once.
    pub text_batch_embeddings: Vec<f16>,
    /// Semantic type code of the task's target.
    pub target_stype: u8,
    /// The task of the batch (metadata order).
    pub task_idx: u32,
    /// The batch's database: its index in the mixture (0 for one database).
    pub db_idx: u32,
    /// First category embedding id of the target column.
    pub cat_emb_start: u32,
    /// Categories of the target column.
    pub cat_emb_count: u32,
    /// Positions (in the task's seed list) of the batch's seeds.
    pub seeds: Vec<u32>,
    /// The split the batch belongs to.
    pub split: crate::seeds::Split,
    /// Index of this batch in its split's stream.
    pub step: u64,
    /// Hash of the step's identity (its derived key, step, rank, world
    /// size), the task and the drawn seeds: identifies the batch for replay.
    pub fingerprint: u64,
    /// `[B]`: 1 for a real sequence, 0 for a padded one (only the last
    /// batch of an evaluation pass has any).
    pub seq_valid: Vec<u8>,
    /// `[B]` each sequence's task (mixture index): the per-sequence form of
    /// `task_idx` (every segment of a sequence has its sequence's task).
    pub seq_task_idx: Vec<u32>,
    /// `[B]` each sequence's target semantic type code.
    pub seq_target_stype: Vec<u8>,
    /// `[B]` first category embedding id of each sequence's target column.
    pub seq_cat_emb_start: Vec<u32>,
    /// `[B]` categories of each sequence's target column.
    pub seq_cat_emb_count: Vec<u32>,
    /// `[B]` each sequence's database (mixture index).
    pub seq_db_idx: Vec<u32>,
    /// M: masked-cell target slots per sequence (0 without masking).
    pub mask_slots: usize,
    /// `[B, S]` 1 at a masked cell (an extra target; `is_target` is 1 too).
    pub is_masked: Vec<u8>,
    /// `[B, M]` position of each masked cell (0 past `mask_count`).
    pub mask_pos: Vec<u16>,
    /// `[B]` masked cells per sequence.
    pub mask_count: Vec<u16>,
    /// `[B, M]` first category id of a masked categorical cell's column.
    pub mask_cat_start: Vec<u32>,
    /// `[B, M]` categories of a masked categorical cell's column.
    pub mask_cat_count: Vec<u32>,
    /// Global pool positions this step consumed per task (mixture index,
    /// positions over every rank), when the step's sequences drew their own
    /// tasks (`task_mixing = "sequence"`); empty for a one-task step.
    pub drawn: Vec<(u32, u64)>,
}

impl Batch {
    /// Zeroed tensors for `b` sequences of `s` cells with up to `r` rows,
    /// one segment each.
    pub fn zeroed(b: usize, s: usize, r: usize, text_dim: usize) -> Batch {
        Self::zeroed_packed(b, s, r, 1, text_dim)
    }

    /// Zeroed tensors for `b` sequences of up to `k` segments.
    pub fn zeroed_packed(b: usize, s: usize, r: usize, k: usize, text_dim: usize) -> Batch {
        let n = b * s;
        Batch {
            batch_size: b,
            seq_len: s,
            max_rows: r,
            num_text: 0,
            text_dim,
            segments: k,
            semantic_types: vec![0; n],
            column_ids: vec![0; n],
            seq_row_ids: vec![0; n],
            numeric_values: vec![0.0; n],
            timestamp_values: vec![0.0; n * TIMESTAMP_DIM],
            bool_values: vec![0; n],
            categorical_embed_ids: vec![0; n],
            text_embed_ids: vec![0; n],
            is_null: vec![0; n],
            is_target: vec![0; n],
            is_padding: vec![1; n],
            fk_adj: vec![0; b * r * r],
            col_perm: vec![0; n],
            out_perm: vec![0; n],
            in_perm: vec![0; n],
            segment_ids: vec![u16::MAX; n],
            target_pos: vec![0; b * k],
            target_count: vec![0; b],
            segment_seeds: vec![u32::MAX; b * k],
            text_batch_embeddings: Vec::new(),
            target_stype: 0,
            task_idx: 0,
            db_idx: 0,
            cat_emb_start: 0,
            cat_emb_count: 0,
            seeds: Vec::with_capacity(b),
            split: crate::seeds::Split::Train,
            step: 0,
            fingerprint: 0,
            seq_valid: vec![1; b],
            seq_task_idx: vec![0; b],
            seq_target_stype: vec![0; b],
            seq_cat_emb_start: vec![0; b],
            seq_cat_emb_count: vec![0; b],
            seq_db_idx: vec![0; b],
            mask_slots: 0,
            is_masked: vec![0; n],
            mask_pos: Vec::new(),
            mask_count: vec![0; b],
            mask_cat_start: Vec::new(),
            mask_cat_count: Vec::new(),
            drawn: Vec::new(),
        }
    }

    /// Non-padding cells over all cells.
    pub fn fill_fraction(&self) -> f64 {
        let pad = self.is_padding.iter().filter(|&&p| p != 0).count();
        1.0 - pad as f64 / self.is_padding.len().max(1) as f64
    }
}
