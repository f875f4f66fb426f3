//! Databases dropped mid-run (`on_bad_database = "skip"`): a database whose
//! block fails its checksum while sampling is dropped **in place** — it
//! keeps its place in the mixture's numbering (database, task, column and
//! category ids, so the trainer's tables stay valid), its tasks' weights
//! become 0 and its share is shared out among the others.
//!
//! The drop set is the core's, read by a producer when its split state is
//! made ([`DropSet`]: the generation, the effective weights and shares);
//! the `Sampler` restarts a split's producer from its delivered state when
//! it meets a producer error after which a database was dropped, or a batch
//! made under an older generation, so every delivered batch is the one a
//! sampler with the drop set of its delivery makes. The hot path reads one
//! atomic ([`SamplerCore::drop_generation`]) per delivered batch.
//!
//! Determinism: the weights of a drop set are a function of the open-time
//! weights and the set of dropped databases, so a sampler resumed from a
//! state saved after the drop (which opens the database, left unread, and
//! drops it in place again) has the same picker, pools and numbering, and
//! delivers the same batches.

use std::sync::atomic::Ordering;

use super::drop_set::DropSet;
use super::plan::SamplerCore;
use crate::config::OnBadDatabase;
use crate::databases::{in_database, DroppedDatabase};
use crate::error::Error;
use crate::say::warn;

impl SamplerCore {
    /// The drop set now (a copy: its vectors are shared).
    pub fn drop_set(&self) -> DropSet {
        self.drops.now.read().unwrap().clone()
    }

    /// The generation of the drop set (bumped at every mid-run drop).
    #[inline]
    pub fn drop_generation(&self) -> u64 {
        self.drops.generation.load(Ordering::Acquire)
    }

    /// Every dropped database: those dropped at open, then those dropped in
    /// place, in the order they were dropped.
    pub fn dropped_databases(&self) -> Vec<DroppedDatabase> {
        self.dropped_under(&self.drop_set())
    }

    /// [`dropped_databases`](Self::dropped_databases) as of the drop set
    /// `now` (one snapshot for a caller that reads it for more).
    pub(crate) fn dropped_under(&self, now: &DropSet) -> Vec<DroppedDatabase> {
        let mut all = self.dropped.clone();
        all.extend(now.gone.iter().map(|(_, d)| d.clone()));
        all
    }

    /// Why task `k`'s database was dropped in place (`None`: it was not).
    pub fn task_dropped(&self, k: usize) -> Option<String> {
        let d = self.tasks[k].db;
        let now = self.drops.now.read().unwrap();
        now.gone
            .iter()
            .find(|(g, _)| *g == d)
            .map(|(_, x)| format!("database `{}` was dropped: {}", x.name, x.reason))
    }

    /// Drop database `d` in place for `reason`, unless it is dropped
    /// already or no other database with a share would be left; `true`
    /// when it was dropped now. `mid_run`: log one line naming it and why
    /// (a resume's open logs its own).
    pub(crate) fn drop_in_place(&self, d: usize, reason: String, mid_run: bool) -> bool {
        let mut now = self.drops.now.write().unwrap();
        if now.gone.iter().any(|(g, _)| *g == d) {
            return false;
        }
        let mut gone: Vec<usize> = now.gone.iter().map(|(g, _)| *g).collect();
        gone.push(d);
        let Some((weights, shares)) = self.weights_without(&gone) else {
            return false;
        };
        let name = self.dbs[d].name.clone();
        if mid_run {
            warn(&format!(
                "database `{name}` is dropped from the mixture mid-run (its weight is shared out): {reason}"
            ));
        }
        now.gone.push((d, DroppedDatabase { name, reason }));
        now.weights = weights.into();
        now.shares = shares.into();
        now.generation += 1;
        self.drops
            .generation
            .store(now.generation, Ordering::Release);
        true
    }

    /// With `on_bad_database = "skip"`, after a producer failed with `e`:
    /// drop in place every database a read found corrupt (see
    /// [`drop_in_place`](Self::drop_in_place)); `true` when one was.
    pub(crate) fn drop_corrupt(&self, e: &Error) -> bool {
        if self.cfg.on_bad_database != OnBadDatabase::Skip || matches!(e, Error::Shutdown) {
            return false;
        }
        let mut any = false;
        for (d, db) in self.dbs.iter().enumerate() {
            if let Err(bad) = db.db.integrity().check() {
                let reason = in_database(&db.name, bad).to_string();
                any |= self.drop_in_place(d, reason, true);
            }
        }
        any
    }

    /// The effective task weights and database shares with the databases
    /// `gone` dropped (`None`: no database with a share would be left).
    fn weights_without(&self, gone: &[usize]) -> Option<(Vec<f64>, Vec<f64>)> {
        let kept: f64 = self
            .dbs
            .iter()
            .enumerate()
            .filter(|(d, _)| !gone.contains(d))
            .map(|(_, db)| db.share)
            .sum();
        let weights: Vec<f64> = self
            .weights
            .iter()
            .zip(&self.tasks)
            .map(|(&w, t)| if gone.contains(&t.db) { 0.0 } else { w / kept })
            .collect();
        if kept <= 0.0 || weights.iter().all(|&w| w <= 0.0) {
            return None;
        }
        let shares = self
            .dbs
            .iter()
            .enumerate()
            .map(|(d, db)| {
                if gone.contains(&d) {
                    0.0
                } else {
                    db.share / kept
                }
            })
            .collect();
        Some((weights, shares))
    }
}
