//! The batch tensors, defined once: name, dtype and shape rule of each of
//! the 20 tensors of the batch layout (docs/sampling.md) plus `fingerprint`, `seq_valid`, the
//! four packing tensors and `db_idx`, in export order.
//!
//! The Python binding builds the batch dict by walking [`TENSORS`] over
//! [`Batch::into_tensors`]; `BATCH_KEYS`, the stubs and the model read the
//! same list. Adding a tensor = one [`TENSORS`] row + its buffer in `Batch`
//! and one line in `into_tensors` (a test checks dtype and length agree).

use half::f16;

use super::{Batch, TIMESTAMP_DIM};

/// Element type of a tensor (NumPy names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// `int8`
    I8,
    /// `uint8`
    U8,
    /// `uint16`
    U16,
    /// `int32`
    I32,
    /// `uint32`
    U32,
    /// `uint64`
    U64,
    /// `float16`
    F16,
    /// `float32`
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 => 1,
            Dtype::U16 | Dtype::F16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::U64 => 8,
        }
    }

    /// The NumPy dtype name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::I8 => "int8",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::I32 => "int32",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
        }
    }
}

/// Shape of a tensor in terms of the batch's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `[B, S]`: one value per cell.
    BS,
    /// `[B, S, TIMESTAMP_DIM]`.
    BST,
    /// `[B, R, R]`: row adjacency per sequence.
    BRR,
    /// `[U, D]`: one embedding per distinct text of the batch.
    UD,
    /// `[1]`: one value per batch.
    One,
    /// `[B]`: one value per sequence.
    B,
    /// `[B, K]`: one value per segment slot of each sequence.
    BK,
    /// `[B, M]`: one value per masked-cell target slot of each sequence.
    BM,
}

impl Shape {
    /// The rule as symbols (`["B", "S"]`, `["B", "S", "15"]`, …).
    pub fn symbols(self) -> Vec<String> {
        let s = |x: &[&str]| x.iter().map(ToString::to_string).collect();
        match self {
            Shape::BS => s(&["B", "S"]),
            Shape::BST => s(&["B", "S", &TIMESTAMP_DIM.to_string()]),
            Shape::BRR => s(&["B", "R", "R"]),
            Shape::UD => s(&["U", "D"]),
            Shape::One => s(&["1"]),
            Shape::B => s(&["B"]),
            Shape::BK => s(&["B", "K"]),
            Shape::BM => s(&["B", "M"]),
        }
    }

    /// The concrete shape for batch `b`'s dimensions.
    pub fn of(self, b: &Batch) -> Vec<usize> {
        match self {
            Shape::BS => vec![b.batch_size, b.seq_len],
            Shape::BST => vec![b.batch_size, b.seq_len, TIMESTAMP_DIM],
            Shape::BRR => vec![b.batch_size, b.max_rows, b.max_rows],
            Shape::UD => vec![b.num_text, b.text_dim],
            Shape::One => vec![1],
            Shape::B => vec![b.batch_size],
            Shape::BK => vec![b.batch_size, b.segments],
            Shape::BM => vec![b.batch_size, b.mask_slots],
        }
    }
}

/// Bytes of a batch with `b` sequences of `s` cells and up to `k` segments
/// and `m` masked-cell slots, `r` rows at most per sequence, `u` distinct
/// texts and `d`-dimensional embeddings: the sum of every [`TENSORS`] row
/// (what the RSS cap predicts a batch costs).
pub fn batch_bytes(
    b: usize,
    s: usize,
    (k, m): (usize, usize),
    r: usize,
    u: usize,
    d: usize,
) -> u64 {
    TENSORS
        .iter()
        .map(|t| {
            let n = match t.shape {
                Shape::BS => b * s,
                Shape::BST => b * s * TIMESTAMP_DIM,
                Shape::BRR => b * r * r,
                Shape::B => b,
                Shape::BK => b * k,
                Shape::BM => b * m,
                Shape::UD => u * d,
                Shape::One => 1,
            };
            (n * t.dtype.size()) as u64
        })
        .sum()
}

/// One tensor of the batch dict.
#[derive(Debug, Clone, Copy)]
pub struct TensorSpec {
    /// Key in the batch dict.
    pub name: &'static str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape rule.
    pub shape: Shape,
}

/// Every tensor of a batch dict, in export order: the 20 tensors of the
/// batch layout (docs/sampling.md), then `fingerprint` (a hash of the step's identity, the task and
/// the drawn seeds, so an anomalous step can be identified and replayed)
/// and `seq_valid` (1 for a real sequence, 0 for a padded one: only the last
/// batch of an evaluation pass has padded sequences, which repeat a seed of
/// the pass and must not be scored), then the packing tensors (see
/// `pack.rs`): `segment_ids` (each cell's segment, `u16::MAX` on padding),
/// `target_pos` (each segment's target position), `target_count` (segments
/// per sequence) and `segment_seeds` (each segment's seed; `u32::MAX` in
/// unused slots; without `pack`, `K = 1`), then `db_idx` (the batch's
/// database: its index in the sampler's mixture, 0 for a single database;
/// `task_idx` is the task's index among the mixture's tasks), then the
/// per-sequence forms of the per-batch target tensors, `[B]` each:
/// `seq_task_idx`, `seq_target_stype`, `seq_cat_emb_start`,
/// `seq_cat_emb_count`, `seq_db_idx` (a sequence's segments share its task,
/// so `[B]` is per target too; with `task_mixing = "sequence"` they differ
/// between sequences and the one-value forms are sequence 0's), then the
/// masked cells (`mask_prob_max`, training batches only): `is_masked`
/// (`[B, S]`, 1 at a masked cell, which is also `is_target`), `mask_pos`
/// (`[B, M]`, each masked cell's position, in position order), `mask_count`
/// (`[B]`, masked cells per sequence: the real slots of `mask_pos`) and
/// `mask_cat_start` / `mask_cat_count` (`[B, M]`, a masked categorical
/// cell's column window; 0 otherwise). `M = ceil(mask_prob_max · S)`, 0
/// by default.
pub static TENSORS: &[TensorSpec] = &[
    TensorSpec {
        name: "semantic_types",
        dtype: Dtype::I8,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "column_ids",
        dtype: Dtype::I32,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "seq_row_ids",
        dtype: Dtype::U16,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "numeric_values",
        dtype: Dtype::F32,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "timestamp_values",
        dtype: Dtype::F32,
        shape: Shape::BST,
    },
    TensorSpec {
        name: "bool_values",
        dtype: Dtype::U8,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "categorical_embed_ids",
        dtype: Dtype::U32,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "text_embed_ids",
        dtype: Dtype::U32,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "is_null",
        dtype: Dtype::U8,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "is_target",
        dtype: Dtype::U8,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "is_padding",
        dtype: Dtype::U8,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "fk_adj",
        dtype: Dtype::U8,
        shape: Shape::BRR,
    },
    TensorSpec {
        name: "col_perm",
        dtype: Dtype::U16,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "out_perm",
        dtype: Dtype::U16,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "in_perm",
        dtype: Dtype::U16,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "text_batch_embeddings",
        dtype: Dtype::F16,
        shape: Shape::UD,
    },
    TensorSpec {
        name: "target_stype",
        dtype: Dtype::U8,
        shape: Shape::One,
    },
    TensorSpec {
        name: "task_idx",
        dtype: Dtype::U32,
        shape: Shape::One,
    },
    TensorSpec {
        name: "cat_emb_start",
        dtype: Dtype::U32,
        shape: Shape::One,
    },
    TensorSpec {
        name: "cat_emb_count",
        dtype: Dtype::U32,
        shape: Shape::One,
    },
    TensorSpec {
        name: "fingerprint",
        dtype: Dtype::U64,
        shape: Shape::One,
    },
    TensorSpec {
        name: "seq_valid",
        dtype: Dtype::U8,
        shape: Shape::B,
    },
    TensorSpec {
        name: "segment_ids",
        dtype: Dtype::U16,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "target_pos",
        dtype: Dtype::U16,
        shape: Shape::BK,
    },
    TensorSpec {
        name: "target_count",
        dtype: Dtype::U8,
        shape: Shape::B,
    },
    TensorSpec {
        name: "segment_seeds",
        dtype: Dtype::U32,
        shape: Shape::BK,
    },
    TensorSpec {
        name: "db_idx",
        dtype: Dtype::U32,
        shape: Shape::One,
    },
    TensorSpec {
        name: "seq_task_idx",
        dtype: Dtype::U32,
        shape: Shape::B,
    },
    TensorSpec {
        name: "seq_target_stype",
        dtype: Dtype::U8,
        shape: Shape::B,
    },
    TensorSpec {
        name: "seq_cat_emb_start",
        dtype: Dtype::U32,
        shape: Shape::B,
    },
    TensorSpec {
        name: "seq_cat_emb_count",
        dtype: Dtype::U32,
        shape: Shape::B,
    },
    TensorSpec {
        name: "seq_db_idx",
        dtype: Dtype::U32,
        shape: Shape::B,
    },
    TensorSpec {
        name: "is_masked",
        dtype: Dtype::U8,
        shape: Shape::BS,
    },
    TensorSpec {
        name: "mask_pos",
        dtype: Dtype::U16,
        shape: Shape::BM,
    },
    TensorSpec {
        name: "mask_count",
        dtype: Dtype::U16,
        shape: Shape::B,
    },
    TensorSpec {
        name: "mask_cat_start",
        dtype: Dtype::U32,
        shape: Shape::BM,
    },
    TensorSpec {
        name: "mask_cat_count",
        dtype: Dtype::U32,
        shape: Shape::BM,
    },
];

/// How many [`TENSORS`] rows are the seed design's.
const SEED_DESIGN_TENSORS: usize = 20;

/// The 20 tensor names of the batch layout (docs/sampling.md) (every [`TENSORS`] row but the
/// fingerprint and the validity mask).
pub fn batch_keys() -> Vec<&'static str> {
    TENSORS[..SEED_DESIGN_TENSORS]
        .iter()
        .map(|t| t.name)
        .collect()
}

/// One tensor's buffer, handed over without a copy.
#[derive(Debug)]
pub enum TensorData {
    /// `int8`
    I8(Vec<i8>),
    /// `uint8`
    U8(Vec<u8>),
    /// `uint16`
    U16(Vec<u16>),
    /// `int32`
    I32(Vec<i32>),
    /// `uint32`
    U32(Vec<u32>),
    /// `uint64`
    U64(Vec<u64>),
    /// `float16`
    F16(Vec<f16>),
    /// `float32`
    F32(Vec<f32>),
}

impl TensorData {
    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            TensorData::I8(_) => Dtype::I8,
            TensorData::U8(_) => Dtype::U8,
            TensorData::U16(_) => Dtype::U16,
            TensorData::I32(_) => Dtype::I32,
            TensorData::U32(_) => Dtype::U32,
            TensorData::U64(_) => Dtype::U64,
            TensorData::F16(_) => Dtype::F16,
            TensorData::F32(_) => Dtype::F32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::I8(v) => v.len(),
            TensorData::U8(v) => v.len(),
            TensorData::U16(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::U32(v) => v.len(),
            TensorData::U64(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::F32(v) => v.len(),
        }
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Batch {
    /// The batch's tensors in [`TENSORS`] order, each with its shape,
    /// consuming the batch (buffers move, nothing is copied).
    pub fn into_tensors(self) -> Vec<(&'static TensorSpec, Vec<usize>, TensorData)> {
        let shapes: Vec<Vec<usize>> = TENSORS.iter().map(|t| t.shape.of(&self)).collect();
        let data = [
            TensorData::I8(self.semantic_types),
            TensorData::I32(self.column_ids),
            TensorData::U16(self.seq_row_ids),
            TensorData::F32(self.numeric_values),
            TensorData::F32(self.timestamp_values),
            TensorData::U8(self.bool_values),
            TensorData::U32(self.categorical_embed_ids),
            TensorData::U32(self.text_embed_ids),
            TensorData::U8(self.is_null),
            TensorData::U8(self.is_target),
            TensorData::U8(self.is_padding),
            TensorData::U8(self.fk_adj),
            TensorData::U16(self.col_perm),
            TensorData::U16(self.out_perm),
            TensorData::U16(self.in_perm),
            TensorData::F16(self.text_batch_embeddings),
            TensorData::U8(vec![self.target_stype]),
            TensorData::U32(vec![self.task_idx]),
            TensorData::U32(vec![self.cat_emb_start]),
            TensorData::U32(vec![self.cat_emb_count]),
            TensorData::U64(vec![self.fingerprint]),
            TensorData::U8(self.seq_valid),
            TensorData::U16(self.segment_ids),
            TensorData::U16(self.target_pos),
            TensorData::U8(self.target_count),
            TensorData::U32(self.segment_seeds),
            TensorData::U32(vec![self.db_idx]),
            TensorData::U32(self.seq_task_idx),
            TensorData::U8(self.seq_target_stype),
            TensorData::U32(self.seq_cat_emb_start),
            TensorData::U32(self.seq_cat_emb_count),
            TensorData::U32(self.seq_db_idx),
            TensorData::U8(self.is_masked),
            TensorData::U16(self.mask_pos),
            TensorData::U16(self.mask_count),
            TensorData::U32(self.mask_cat_start),
            TensorData::U32(self.mask_cat_count),
        ];
        TENSORS
            .iter()
            .zip(shapes)
            .zip(data)
            .map(|((spec, shape), d)| (spec, shape, d))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn into_tensors_matches_the_list_in_dtype_and_length() {
        let mut b = Batch::zeroed(3, 7, 4, 8);
        b.num_text = 2;
        b.text_batch_embeddings = vec![f16::ZERO; 16];
        let got = b.into_tensors();
        assert_eq!(got.len(), TENSORS.len());
        for (spec, shape, data) in got {
            assert_eq!(data.dtype(), spec.dtype, "{}", spec.name);
            assert_eq!(data.len(), shape.iter().product::<usize>(), "{}", spec.name);
        }
        assert_eq!(batch_keys().len(), 20);
        assert_eq!(TENSORS[SEED_DESIGN_TENSORS].name, "fingerprint");
        assert_eq!(TENSORS[SEED_DESIGN_TENSORS + 1].name, "seq_valid");
        assert_eq!(TENSORS.last().map(|t| t.name), Some("mask_cat_count"));
        let mut p = Batch::zeroed_packed(2, 5, 3, 4, 8);
        p.num_text = 0;
        for (spec, shape, data) in p.into_tensors() {
            assert_eq!(data.len(), shape.iter().product::<usize>(), "{}", spec.name);
        }
    }
}
