//! The drop set of a sampler core (`drops.rs` drops databases into it):
//! which databases were dropped in place, the weights and shares they
//! leave, and its generation, read without a lock on the delivery path.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use crate::databases::DroppedDatabase;

/// The databases dropped in place and the weights they leave.
#[derive(Debug, Clone, Default)]
pub struct DropSet {
    /// Bumped at every drop (0: none yet).
    pub generation: u64,
    /// The databases dropped in place (mixture index, name and reason), in
    /// the order they were dropped.
    pub gone: Vec<(usize, DroppedDatabase)>,
    /// The effective task weights (the open-time ones with the dropped
    /// databases' tasks at 0, the others scaled to the share left).
    pub weights: Arc<[f64]>,
    /// Each database's share of batches (0 for a dropped one).
    pub shares: Arc<[f64]>,
}

/// The core's drop set and its generation (read without a lock).
#[derive(Debug, Default)]
pub(crate) struct Drops {
    pub(super) generation: AtomicU64,
    pub(super) now: RwLock<DropSet>,
}

impl Drops {
    /// The drop set of a core that has dropped nothing in place: its
    /// open-time `weights` and database `shares`.
    pub(crate) fn none(weights: &[f64], shares: &[f64]) -> Drops {
        Drops {
            generation: AtomicU64::new(0),
            now: RwLock::new(DropSet {
                generation: 0,
                gone: Vec::new(),
                weights: weights.into(),
                shares: shares.into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_drop_set_keeps_the_open_weights() {
        let d = Drops::none(&[0.25, 0.75], &[1.0]);
        let s = d.now.read().unwrap();
        assert_eq!((s.generation, s.gone.len()), (0, 0));
        assert_eq!(&*s.weights, &[0.25, 0.75]);
        assert_eq!(&*s.shares, &[1.0]);
    }
}
