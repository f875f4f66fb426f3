//! Text collation: a batch's text cells from global text ids to batch-local
//! ones, each distinct text embedding gathered once (the batch's only serial
//! phase); one database's or a mixture's.
//!
//! Never: a cell other than a text cell, or a change to the batch's layout.

use half::f16;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::Batch;
use crate::format::EmbeddingRows;

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
}
