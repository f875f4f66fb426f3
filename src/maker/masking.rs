//! Masked cells (`mask_prob_max > 0`): each sequence of a
//! training batch draws `p` uniformly in `[0, mask_prob_max]` from its own
//! key and masks each eligible cell with probability `p`, as an extra
//! target: `is_target` and `is_masked` are set (the model hides a target's
//! value and null bit from its input, as for the seed's target; the value
//! stays in the tensors as the label), and the cell joins the sequence's
//! masked-target slots (`mask_pos`, with its column's categorical window in
//! `mask_cat_start` / `mask_cat_count`).
//!
//! Eligible: a real, non-null cell of a type with a decoder head
//! (numerical, boolean, timestamp, categorical: not text), not already a
//! target. Keys and row structure are not cells (they are `fk_adj`), so
//! nothing structural can be masked. A sequence masks at most
//! `M = ceil(mask_prob_max · S)` cells (the first ones, in position order).
//!
//! Never: masking without `mask_prob_max > 0` (the default batch is never
//! touched), or in evaluation passes (they score the seed's target only).

use super::plan::SamplerCore;
use super::MadeBatch;
use crate::rng::Xoshiro256pp;

impl SamplerCore {
    /// Mask cells of every sequence of `made`, sequence `q` keyed by
    /// `derive(key, [q])`; counts each sequence's masked cells.
    pub(super) fn mask_cells(&self, made: &mut MadeBatch, key: u64) {
        let m = self.cfg.mask_slots_at(made.batch.seq_len);
        let pmax = self.cfg.mask_prob_max;
        let MadeBatch { batch, readings } = made;
        let (b, s) = (batch.batch_size, batch.seq_len);
        batch.mask_slots = m;
        batch.mask_pos = vec![0; b * m];
        batch.mask_cat_start = vec![0; b * m];
        batch.mask_cat_count = vec![0; b * m];
        for q in 0..b {
            let mut rng = Xoshiro256pp::seed_from_u64(super::derive(key, &[q as u64]));
            let p = rng.next_f64() * pmax;
            let mut n = 0;
            for j in q * s..(q + 1) * s {
                if n == m {
                    break;
                }
                let t = batch.semantic_types[j];
                let eligible = (0..=3).contains(&t)
                    && batch.is_padding[j] == 0
                    && batch.is_null[j] == 0
                    && batch.is_target[j] == 0;
                // One draw per eligible cell, so a cell's fate does not
                // depend on how many cells before it were masked.
                if !eligible || rng.next_f64() >= p {
                    continue;
                }
                batch.is_target[j] = 1;
                batch.is_masked[j] = 1;
                let slot = q * m + n;
                batch.mask_pos[slot] = (j - q * s) as u16;
                if t == 3 {
                    let (start, count) =
                        self.category_window(batch.seq_db_idx[q], batch.column_ids[j]);
                    batch.mask_cat_start[slot] = start;
                    batch.mask_cat_count[slot] = count;
                }
                n += 1;
            }
            batch.mask_count[q] = n as u16;
            if let Some(r) = readings.seqs.get_mut(q) {
                r.masked_cells = n as u32;
            }
        }
    }

    /// The categorical window (first id in the mixture's concatenated
    /// table, categories) of mixture column `column` of database `db`.
    fn category_window(&self, db: u32, column: i32) -> (u32, u32) {
        let mdb = &self.dbs[db as usize];
        let local = (column as u32).wrapping_sub(mdb.column_offset) as usize;
        mdb.db.metadata().columns.get(local).map_or((0, 0), |c| {
            (c.cat_emb_start + mdb.categorical_offset, c.cat_emb_count)
        })
    }
}
