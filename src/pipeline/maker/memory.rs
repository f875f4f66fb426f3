//! How the databases are read given the memory the process has: the
//! budget (`memory_budget`, else the memory cgroup's limit, else the host's
//! memory) against the bytes of every mapped file.
//!
//! A mixture whose files add up to more than the budget cannot stay in the
//! page cache, so its random reads are made without read-ahead
//! (`Database::advise_random`): a fault reads the one page a batch needs
//! instead of the kernel's read-ahead window (8 MiB on some virtual disks)
//! around it, which would evict pages the next batch needs. A mixture that
//! fits keeps the kernel's default: its cold start reads ahead, and once
//! resident the advice changes nothing.
//!
//! Never changes what a batch holds: only how its pages are brought in.

use std::sync::Arc;

use crate::config::SamplerConfig;
use crate::format::Database;

/// What [`plan_reads`] decided, for the sampler's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// The budget the decision used (bytes), if one was known.
    pub budget_bytes: Option<u64>,
    /// Bytes of every mapped file of every database.
    pub mapped_bytes: u64,
    /// Whether read-ahead was turned off (the mapped bytes exceed the budget).
    pub random_reads: bool,
}

/// Decide, and advise the maps, for `dbs` under `cfg`'s budget.
pub(super) fn plan_reads(dbs: &[(String, Arc<Database>)], cfg: &SamplerConfig) -> ReadPlan {
    let budget_bytes = cfg.memory_budget.or_else(crate::format::memory_limit_bytes);
    let mapped_bytes = dbs.iter().map(|(_, d)| d.bytes_on_disk()).sum();
    let random_reads = budget_bytes.is_some_and(|b| mapped_bytes > b);
    if random_reads {
        for (_, d) in dbs {
            d.advise_random();
        }
    }
    ReadPlan {
        budget_bytes,
        mapped_bytes,
        random_reads,
    }
}
