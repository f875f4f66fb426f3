//! The seed lists behind a sampler's pools, made on first use: a (task,
//! split)'s list (the positions of its seeds in the split, then
//! `pool_fraction`'s evenly spaced subset) is computed from the mapped task
//! file the first time a draw, a state capture or a pool reading needs it,
//! once per sampler, and shared by every split state, replay and producer
//! restart (`Arc`). Opening a sampler reads no seed: it asks only whether a
//! (task, split) has any seed, which the first few seeds answer.
//!
//! Each list is the one the open used to build eagerly, bit for bit (the
//! same hash rule or stored codes, the same subset), so pools, batches and
//! saved states do not change. Reads are checked (`TaskView`'s accessors,
//! `Database::task_split_codes`): a list read from a corrupt block is an
//! error, never a pool.
//!
//! Never: a random choice (the pools' orders are `crate::seeds`'), or a
//! read of a task no draw, capture or reading asked for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::SamplerCore;
use crate::config::SamplerConfig;
use crate::error::Result;
use crate::format::{Database, Split, TaskView};
use crate::seeds::{split_has_buckets, split_of, split_seeds};

/// Per mixture task: its seed list in each split (by [`Split::index`]) and
/// its seeds per split, each made on first use.
pub(crate) struct SeedLists {
    dbs: Vec<Arc<Database>>,
    /// (database, local task index) of each mixture task.
    tasks: Vec<(usize, usize)>,
    split_seed: u64,
    ratios: [f64; 3],
    fraction: f64,
    lists: Vec<[OnceLock<Arc<[u32]>>; 3]>,
    counts: Vec<OnceLock<[u64; 3]>>,
    /// Lists made so far (a list made twice by racing threads counts
    /// twice): what a test reads to see that open made none.
    made: AtomicU64,
}

impl SeedLists {
    /// The lists of the mixture tasks `tasks` ((database, local index)) of
    /// `dbs`, split by `cfg`'s split seed and ratios (or stored codes) and
    /// cut to its `pool_fraction`; nothing is read.
    pub(crate) fn new(
        dbs: Vec<Arc<Database>>,
        tasks: Vec<(usize, usize)>,
        cfg: &SamplerConfig,
    ) -> Self {
        let n = tasks.len();
        SeedLists {
            dbs,
            tasks,
            split_seed: cfg.split_seed,
            ratios: cfg.split_ratios,
            fraction: cfg.pool_fraction,
            lists: (0..n).map(|_| Default::default()).collect(),
            counts: (0..n).map(|_| OnceLock::new()).collect(),
            made: AtomicU64::new(0),
        }
    }

    /// Lists made so far.
    pub(crate) fn made(&self) -> u64 {
        self.made.load(Ordering::Relaxed)
    }

    fn view(&self, k: usize) -> Result<(&Database, usize, TaskView<'_>)> {
        let (d, local) = self.tasks[k];
        let db = &*self.dbs[d];
        Ok((db, local, db.task_lazy(local)?))
    }

    /// Task `k`'s list in `split`, made on first call.
    ///
    /// # Errors
    /// A corrupt block of the task's anchor rows or stored codes, or a
    /// stored code that names no split.
    pub(crate) fn list(&self, k: usize, split: Split) -> Result<Arc<[u32]>> {
        let cell = &self.lists[k][split.index()];
        if let Some(l) = cell.get() {
            return Ok(l.clone());
        }
        let (db, local, view) = self.view(k)?;
        let seeds = match db.task_split_codes(local)? {
            Some(codes) => codes
                .iter()
                .enumerate()
                .filter(|&(_, &c)| Split::from_code(c) == Some(split))
                .map(|(pos, _)| pos as u32)
                .collect(),
            None => split_seeds(
                local as u32,
                view.checked_anchor_rows(),
                split,
                self.split_seed,
                self.ratios,
            ),
        };
        // The anchor rows were read through their block checks.
        db.integrity().check()?;
        self.made.fetch_add(1, Ordering::Relaxed);
        Ok(cell
            .get_or_init(|| keep_fraction(seeds, self.fraction).into())
            .clone())
    }

    /// The length of task `k`'s list in `split`: its list's when made, else
    /// counted (one pass over the task's anchor rows or codes, for every
    /// split at once, kept; no list is made).
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn len(&self, k: usize, split: Split) -> u64 {
        if let Some(l) = self.lists[k][split.index()].get() {
            return l.len() as u64;
        }
        let n = self.counts[k].get_or_init(|| self.count(k))[split.index()];
        kept_len(n, self.fraction)
    }

    /// Seeds of task `k` in each split, in one pass. A block that fails its
    /// check is in the database's record (the next batch fails); a code
    /// that names no split counts in none ([`list`](Self::list) refuses it).
    fn count(&self, k: usize) -> [u64; 3] {
        let mut n = [0u64; 3];
        let Ok((_, local, view)) = self.view(k) else {
            return n;
        };
        if let Some(codes) = view.checked_splits() {
            for &c in codes {
                if let Some(s) = Split::from_code(c) {
                    n[s.index()] += 1;
                }
            }
        } else {
            for &row in view.checked_anchor_rows() {
                n[split_of(local as u32, row, self.split_seed, self.ratios).index()] += 1;
            }
        }
        n
    }

    /// Whether task `k` has any seed in `split`: read from the first seeds
    /// until one is in it (the first few, unless the split is rare in the
    /// task); no read when the ratios give the split no bucket.
    pub(crate) fn any(&self, k: usize, split: Split) -> bool {
        if let Some(l) = self.lists[k][split.index()].get() {
            return !l.is_empty();
        }
        if let Some(c) = self.counts[k].get() {
            return c[split.index()] > 0;
        }
        let Ok((_, local, view)) = self.view(k) else {
            return false;
        };
        if view.splits.is_some() {
            return (0..view.len())
                .any(|i| view.split_code(i).and_then(Split::from_code) == Some(split));
        }
        split_has_buckets(split, self.ratios)
            && (0..view.len()).any(|i| {
                view.anchor_row(i).is_some_and(|r| {
                    split_of(local as u32, r, self.split_seed, self.ratios) == split
                })
            })
    }
}

impl SamplerCore {
    /// The view of mixture task `k` whose reads are checked as made (a
    /// draw's: the blocks of the seeds it uses, `TaskView::check_seed`).
    pub(crate) fn task_lazy(&self, k: usize) -> Result<TaskView<'_>> {
        let p = &self.tasks[k];
        self.dbs[p.db].db.task_lazy(p.local)
    }

    /// Seed lists made so far, over every (task, split): none at open (a
    /// pool's list is made at its task's first draw; a pool reading or a
    /// saved state counts the others without making them).
    pub fn seed_lists_made(&self) -> u64 {
        self.seed_lists.made()
    }
}

/// The length of [`keep_fraction`] of `n` seeds.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn kept_len(n: u64, fraction: f64) -> u64 {
    if fraction >= 1.0 || n == 0 {
        n
    } else {
        ((n as f64 * fraction).ceil() as u64).clamp(1, n)
    }
}

/// An evenly spaced `fraction` of `seeds` (at least one when any), in order.
#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]
fn keep_fraction(seeds: Vec<u32>, fraction: f64) -> Vec<u32> {
    if fraction >= 1.0 || seeds.is_empty() {
        return seeds;
    }
    let n = seeds.len();
    let k = ((n as f64 * fraction).ceil() as usize).clamp(1, n);
    (0..k).map(|j| seeds[j * n / k]).collect()
}

#[cfg(test)]
mod tests {
    use super::{keep_fraction, kept_len};

    #[test]
    fn keep_fraction_is_an_even_subset_of_at_least_one() {
        let seeds: Vec<u32> = (0..100).collect();
        assert_eq!(keep_fraction(seeds.clone(), 1.0), seeds);
        let tenth = keep_fraction(seeds.clone(), 0.1);
        assert_eq!(tenth, (0..10).map(|j| j * 10).collect::<Vec<u32>>());
        assert_eq!(keep_fraction(seeds.clone(), 1e-9), vec![0]);
        assert_eq!(keep_fraction(vec![], 0.5), Vec::<u32>::new());
        let third = keep_fraction(seeds.clone(), 0.333);
        assert_eq!(third.len(), 34);
        assert!(third.windows(2).all(|w| w[0] < w[1]), "ordered, no repeats");
        for n in [0u32, 1, 7, 100, 1001] {
            for f in [1.0, 0.5, 0.333, 0.1, 1e-9] {
                let got = keep_fraction((0..n).collect(), f).len() as u64;
                assert_eq!(kept_len(u64::from(n), f), got, "n={n} f={f}");
            }
        }
    }
}
