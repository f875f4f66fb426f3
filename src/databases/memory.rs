//! How the databases are read given the memory the process has: the
//! budget (`memory_budget`, else the memory cgroup's limit, else the host's
//! memory) against the bytes of every mapped file.
//!
//! A mixture whose files add up to more than [`MARGIN`] times the budget
//! cannot stay in the page cache, so its random reads are made without
//! read-ahead
//! (`Database::advise_random`): a fault reads the one page a batch needs
//! instead of the kernel's read-ahead window (8 MiB on some virtual disks)
//! around it, which would evict pages the next batch needs. A mixture that
//! fits, or nearly fits, keeps the kernel's default: most of what it reads
//! ahead stays and is used. Measured on TPC-H SF 1 (1.37 GB, one thread) in
//! memory cgroups of 1,100 and 1,300 MiB: without read-ahead 19.9 and 12.2
//! batches/s, with it 3.7 and 44.9 (docs/benchmarks/2026-11-28-memory.md);
//! the margin lies between the two.
//!
//! With hot sets (`hot_set_bytes`) the pages read at once are two groups'
//! (the one training and the next read ahead), not the whole mixture: the
//! decision weighs those, and a budget below them is warned about.
//!
//! Never changes what a batch holds: only how its pages are brought in.

use std::sync::Arc;

use crate::config::SamplerConfig;
use crate::format::Database;

/// How far the mapped bytes may exceed the budget before read-ahead is
/// turned off (a database at 1.0x its cgroup keeps most of what the kernel
/// reads ahead; at 1.18x read-ahead evicts what the next batch needs).
pub const MARGIN: f64 = 1.1;

/// What [`plan_reads`] decided, for the sampler's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// The budget the decision used (bytes), if one was known.
    pub budget_bytes: Option<u64>,
    /// Bytes of every mapped file of every database.
    pub mapped_bytes: u64,
    /// Whether read-ahead was turned off (the mapped bytes exceed
    /// [`MARGIN`] times the budget).
    pub random_reads: bool,
}

/// `memory_budget` (`given`) or the budget found (`found`: the cgroup's)
/// against `need`, the least the batches in flight take (`cells` each): an
/// error for a given budget below it, the warning for a found one.
fn check_budget(
    given: Option<u64>,
    found: Option<u64>,
    (need, cells): (u64, usize),
) -> crate::error::Result<Option<String>> {
    Ok(match (given, found) {
        (Some(b), _) if b < need => {
            return Err(crate::error::Error::config_value(
                "memory_budget",
                b.to_string(),
                format!(
                    "below what the batches in flight alone take: at least {need} bytes \
                     (num_prefetch + num_threads + 2 batches of {cells} cells); raise it, or \
                     lower num_prefetch, num_threads or the batch's cells"
                ),
            ));
        }
        (None, Some(b)) if b < need => Some(format!(
            "this process's memory cgroup allows {b} bytes, less than the batches in flight \
             alone take ({need} bytes): the sampler will be killed or thrash; give it more \
             memory, or lower num_prefetch, num_threads or the batch's cells"
        )),
        _ => None,
    })
}

/// Decide, and advise the maps, for `dbs` under `cfg`'s budget. A
/// `memory_budget` below `in_flight` (the least the batches in flight take,
/// and their cells each, from the maker) is an error naming both; a memory
/// cgroup that small, a warning.
pub(crate) fn plan_reads(
    dbs: &[(String, Arc<Database>)],
    cfg: &SamplerConfig,
    in_flight: (u64, usize),
) -> crate::error::Result<ReadPlan> {
    let budget_bytes = cfg.memory_budget.or_else(crate::format::memory_limit_bytes);
    if let Some(w) = check_budget(cfg.memory_budget, budget_bytes, in_flight)? {
        crate::say::warn(&w);
    }
    let mapped_bytes: u64 = dbs.iter().map(|(_, d)| d.bytes_on_disk()).sum();
    // With hot sets the run reads two groups at once (the one it trains
    // on, the next read ahead), each at most `hot_set_bytes` or one
    // database larger than it.
    let working = cfg.hot_set_bytes.map_or(mapped_bytes, |h| {
        let largest = dbs
            .iter()
            .map(|(_, d)| d.bytes_on_disk())
            .max()
            .unwrap_or(0);
        mapped_bytes.min(h.max(largest).saturating_mul(2))
    });
    if let (Some(h), Some(b)) = (cfg.hot_set_bytes, budget_bytes) {
        if h.saturating_mul(2) > b {
            crate::say::warn(&format!(
                "hot_set_bytes = {h}: a hot set and the next one read ahead need {} bytes, \
                 more than this process's memory budget of {b} bytes (memory_budget or its \
                 cgroup); set it to at most {}",
                h.saturating_mul(2),
                b / 2
            ));
        }
    }
    let random_reads = over_budget(working, budget_bytes);
    if random_reads {
        for (_, d) in dbs {
            d.advise_random();
        }
    }
    Ok(ReadPlan {
        budget_bytes,
        mapped_bytes,
        random_reads,
    })
}

/// Whether a working set of `working` bytes is over [`MARGIN`] times the
/// budget.
fn over_budget(working: u64, budget_bytes: Option<u64>) -> bool {
    budget_bytes.is_some_and(|b| working as f64 > b as f64 * MARGIN)
}

impl ReadPlan {
    /// The plan with `extra` bytes of files derived from the databases
    /// counted too (the walk graphs the contexts walk, the stored rankings
    /// they read: what `examples` maps beside each database), the working
    /// set growing in proportion with hot sets. `true` when read-ahead is
    /// now to be turned off where it was not: the caller advises every
    /// mapped file (a database of 1.27 GiB fits a 1.2 GiB budget by the
    /// margin, its 0.5 GiB of stored rankings beside it does not).
    pub(crate) fn with_derived(&mut self, extra: u64, cfg: &SamplerConfig) -> bool {
        let before = self.mapped_bytes;
        self.mapped_bytes = before.saturating_add(extra);
        if self.random_reads || extra == 0 {
            return false;
        }
        // Without hot sets the working set is every mapped byte; with them
        // two groups, which grow by the derived files' share.
        let working = match cfg.hot_set_bytes {
            None => self.mapped_bytes,
            Some(h) => {
                (h.saturating_mul(2) as f64 * self.mapped_bytes as f64 / before.max(1) as f64)
                    as u64
            }
        };
        self.random_reads = over_budget(working.min(self.mapped_bytes), self.budget_bytes);
        self.random_reads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_below_the_batches_in_flight_is_refused_or_warned_about() {
        let need = (18 << 20, 32 * 1024);
        let e = check_budget(Some(need.0 - 1), Some(need.0 - 1), need).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("memory_budget") && e.contains(&need.0.to_string()),
            "{e}"
        );
        let w = check_budget(None, Some(need.0 - 1), need)
            .unwrap()
            .expect("warned");
        assert!(
            w.contains("cgroup") && w.contains(&need.0.to_string()),
            "{w}"
        );
        // Enough, or nothing known: quiet.
        assert_eq!(
            check_budget(Some(need.0), Some(need.0), need).unwrap(),
            None
        );
        assert_eq!(check_budget(None, Some(need.0), need).unwrap(), None);
        assert_eq!(check_budget(None, None, need).unwrap(), None);
    }
}
