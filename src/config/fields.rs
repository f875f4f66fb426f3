//! The sampler keys as data: [`FIELDS`], one row per key of
//! [`SamplerConfig`](super::SamplerConfig) (name, type, allowed range, doc),
//! in field order. This file is a named data table: it is long because
//! there are many keys, not because it holds logic.
//!
//! Invariants: one row per field, in field order (a test in `mod.rs` keeps
//! them equal); a row's `range` is the text every error for its key
//! states. Never: checks here; `SamplerConfig::validate` is the only check.

use serde::Serialize;

use crate::error::Error;

/// One key's type, allowed values and meaning.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FieldDoc {
    /// Key (TOML key, Rust field, Python keyword).
    pub name: &'static str,
    /// Python-style type.
    #[serde(rename = "type")]
    pub ty: &'static str,
    /// Allowed values, as every error for this key states them.
    pub range: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// Every key of [`SamplerConfig`](super::SamplerConfig), in field order (a
/// test keeps them equal).
pub static FIELDS: &[FieldDoc] = &[
    FieldDoc {
        name: "rank",
        ty: "int",
        range: "an integer in 0..world_size",
        doc: "this process's rank",
    },
    FieldDoc {
        name: "world_size",
        ty: "int",
        range: "an integer in 1..=4294967295",
        doc: "number of ranks",
    },
    FieldDoc {
        name: "split_ratios",
        ty: "tuple[float, float, float]",
        range: "three finite numbers >= 0 that sum to 1",
        doc: "train / val / test shares of each task's seeds (hash split; not for a task with stored splits, e.g. RelBench)",
    },
    FieldDoc {
        name: "split_seed",
        ty: "int",
        range: "an integer in 0..=2^64-1",
        doc: "seed of the split hash (independent of seed, rank, world_size)",
    },
    FieldDoc {
        name: "seed",
        ty: "int",
        range: "an integer in 0..=2^64-1",
        doc: "seed of all sampling randomness (combined with rank and split)",
    },
    FieldDoc {
        name: "num_prefetch",
        ty: "int",
        range: "an integer in 1..=1024",
        doc: "capacity of each prefetch channel (batches)",
    },
    FieldDoc {
        name: "default_batch_size",
        ty: "int",
        range: "an integer in 1..=65536",
        doc: "sequences per batch (B)",
    },
    FieldDoc {
        name: "default_sequence_length",
        ty: "int",
        range: "an integer in 1..=65535 (cell positions are u16)",
        doc: "cells per sequence (S)",
    },
    FieldDoc {
        name: "sequence_lengths",
        ty: "list[int]",
        range: "[] (every step has S = default_sequence_length), or a list of distinct integers in 1..=65535 (cell positions are u16), with tokens_per_batch set and pack off",
        doc: "variable length: each step of the train stream draws its S from this list, uniformly and deterministically from (seed, step), the same on every rank; the step has B = tokens_per_batch / S sequences per rank (the val stream and evaluation passes keep default_batch_size x default_sequence_length)",
    },
    FieldDoc {
        name: "tokens_per_batch",
        ty: "int | None",
        range: "None (without sequence_lengths), or with sequence_lengths an integer divisible by every listed length, at least the longest (one sequence) and at most 65536 x the shortest",
        doc: "with sequence_lengths: cells per rank per step (B x S), fixed while S varies (RT-J's token budget per device)",
    },
    FieldDoc {
        name: "bfs_child_width",
        ty: "int",
        range: "an integer in 1..=2^64-1",
        doc: "at most this many children sampled per row per hop",
    },
    FieldDoc {
        name: "max_hops",
        ty: "int",
        range: "an integer in 0..=64",
        doc: "BFS hops from the seed row",
    },
    FieldDoc {
        name: "pack",
        ty: "bool",
        range: "true or false",
        doc: "pack pack_factor seeds' contexts into each sequence (segment-masked)",
    },
    FieldDoc {
        name: "pack_factor",
        ty: "int",
        range: "an integer in 0..=64, with pack: pack_factor x the largest seed row <= default_sequence_length",
        doc: "with pack: seeds (segments) per sequence on average; 0 = per task, as many as fill S on average (mean context size measured on a probe of the task's seeds at start-up); contexts are balanced over the sequences and only those above a water level are cut",
    },
    FieldDoc {
        name: "task_weights",
        ty: "list[float] | dict[str, float] | None",
        range: "None, one finite weight >= 0 per task (metadata order), or {task name: weight} (unlisted tasks keep 1); at least one > 0",
        doc: "task weights for weighted picking (None = uniform)",
    },
    FieldDoc {
        name: "task_pick",
        ty: "str",
        range: "\"weighted\" or \"round_robin\"",
        doc: "how the task of each batch is chosen",
    },
    FieldDoc {
        name: "task_mixing",
        ty: "str",
        range: "\"step\" or \"sequence\"; \"sequence\" needs pack off",
        doc: "step: one task per step on every rank (task_pick); sequence: each sequence draws its own (database, task) by the task weights, so a batch mixes tasks and target types (per-sequence seq_* tensors; task_pick round_robin cycles over the sequences)",
    },
    FieldDoc {
        name: "database_weights",
        ty: "list[float] | dict[str, float] | None",
        range: "None, one finite weight >= 0 per database (the order given), or {database name: weight} (unlisted databases keep 1); at least one > 0",
        doc: "share of batches per database of a mixture (None = uniform over databases)",
    },
    FieldDoc {
        name: "telemetry_top_databases",
        ty: "int",
        range: "an integer in 0..=1024",
        doc: "databases of a mixture with their own telemetry series (largest weights; ignored when telemetry_databases is set); the rest are folded into aggregates",
    },
    FieldDoc {
        name: "telemetry_databases",
        ty: "list[str]",
        range: "a list of at most 1024 distinct database names of the mixture ([] = the telemetry_top_databases largest weights)",
        doc: "databases of a mixture with their own telemetry series, in this order (replaces telemetry_top_databases when not empty); the rest are folded into aggregates",
    },
    FieldDoc {
        name: "on_bad_database",
        ty: "str",
        range: "\"error\" or \"skip\"",
        doc: "a database of a mixture that fails to open (missing, unreadable, bad header or checksum table): error fails the open naming it; skip drops it with one line naming it and why, shares its weight out among the others, counts it (databases/dropped) and records it in the saved state, so a resume drops it again",
    },
    FieldDoc {
        name: "stage_dir",
        ty: "str | None",
        range: "None or a directory path",
        doc: "node-local folder each database is copied to before it is read (once per host under a lock, verified by every checksum, marked `.staged`, resumed when cut off; a new snapshot is staged beside the old one); None: read in place",
    },
    FieldDoc {
        name: "num_threads",
        ty: "int | None",
        range: "None or an integer in 1..=1024",
        doc: "threads in the sampler's pool (None = available parallelism)",
    },
    FieldDoc {
        name: "max_rss_bytes",
        ty: "int | None",
        range: "None or an integer in 1..=2^64-1",
        doc: "fail fast when the process RSS exceeds this many bytes",
    },
    FieldDoc {
        name: "memory_budget",
        ty: "int | None",
        range: "None or an integer in 2^20..=2^64-1 (1 MiB or more)",
        doc: "bytes of memory, page cache included, the sampler plans its reads for (None = the memory cgroup's limit, else the host's memory); databases more than 1.1 times larger are read without read-ahead",
    },
    FieldDoc {
        name: "verify",
        ty: "str",
        range: "\"header\" or \"full\"",
        doc: "open check: header (sizes + metadata hash + block tables, O(metadata); format-2 blocks are then hashed on their first read) or full (also every payload checksum at open)",
    },
    FieldDoc {
        name: "page_cache",
        ty: "str",
        range: "\"lazy\", \"willneed\", \"populate\" or \"mlock\"",
        doc: "at open: lazy (page faults), willneed (madvise read-ahead), populate (fault every page in), mlock (populate and lock; needs RLIMIT_MEMLOCK); the last three also advise huge pages",
    },
    FieldDoc {
        name: "temporal_filter",
        ty: "bool",
        range: "true or false",
        doc: "filter children by the seed's observation time (off: the temporal-leak invariant lights up)",
    },
    FieldDoc {
        name: "recipe",
        ty: "str | None",
        range: "None or \"rt-j\"",
        doc: "a named set of keys applied to those not given: rt-j = RT-J's in-context pretraining (examples on, 10,000 walks of 20 rows ranked by visits, local_context_sizes 256/512/1024 and bfs_widths 8..256 up to the run's S, prefer_latest both ways); a query task then gets weight 0 with a warning instead of refusing the config",
    },
    FieldDoc {
        name: "examples",
        ty: "bool",
        range: "true or false; true needs every task with weight > 0 to have a target column of its anchor table (a cell task) and other rows in that table, and pack off",
        doc: "in-context contexts (docs/contexts.md): the seed's BFS (tier 0), then labelled rows of the seed's table ranked by example_ranker (tier 1), then random ones (tier 2); off: the plain layout (the seed's BFS only)",
    },
    FieldDoc {
        name: "local_context_sizes",
        ty: "list[int]",
        range: "with examples: a non-empty list of integers in 1..=the longest S (the larger of default_sequence_length and the largest of sequence_lengths; a value above a batch's S is clamped to it)",
        doc: "with examples: each sequence draws the cell budget of its seed's BFS (tier 0) and of each example's BFS shell from this list",
    },
    FieldDoc {
        name: "bfs_widths",
        ty: "list[int]",
        range: "with examples: a non-empty list of integers in 1..=the longest S (the larger of default_sequence_length and the largest of sequence_lengths)",
        doc: "with examples: each sequence draws its BFS child width (tiers 0 and 1) from this list (replaces bfs_child_width)",
    },
    FieldDoc {
        name: "prefer_latest",
        ty: "list[bool]",
        range: "with examples: a non-empty list of true / false",
        doc: "with examples: each sequence draws whether its examples are ranked by recency first (then walk visits) or by walk visits",
    },
    FieldDoc {
        name: "num_walks",
        ty: "int",
        range: "an integer in 0..=10000000 (0 = no walks: examples are random rows, tier 2)",
        doc: "with examples and example_ranker walks: random walks from the seed whose visit counts rank the examples",
    },
    FieldDoc {
        name: "walk_length",
        ty: "int",
        range: "an integer in 1..=1024",
        doc: "with examples: rows each random walk visits (the seed first)",
    },
    FieldDoc {
        name: "mask_prob_max",
        ty: "float",
        range: "a number in [0, 1]",
        doc: "highest per-sequence probability of masking a cell: each training sequence draws p uniformly in [0, mask_prob_max] and masks each visible non-null cell of a decodable type (not text, not the seed's target) with probability p, as an extra target (is_masked, mask_pos; at most ceil(mask_prob_max x S) per sequence); 0 = no masking (docs/contexts.md)",
    },
    FieldDoc {
        name: "example_ranker",
        ty: "str",
        range: "\"walks\", \"adaptive\" or \"expected\"",
        doc: "with examples: how tier-1 examples are ranked; walks: visit counts of num_walks random walks of walk_length over the FK graph (RT-J's semantics); adaptive: the same walks in blocks of 64, stopped once the examples the context would take have not changed for 2 blocks (at most 256 walks); expected: the visit counts num_walks walks are expected to give, computed by spreading the walk's probability over the graph step by step, no walk drawn (deterministic): docs/contexts.md",
    },
    FieldDoc {
        name: "expected_prune",
        ty: "float",
        range: "a number in (0, 1000]",
        doc: "with examples and example_ranker expected: a row spreads its walk probability only when each neighbour's share is at least this many expected visits of num_walks walks (its mass is dropped otherwise); lower: closer to the exact expectation and slower (docs/contexts.md)",
    },
    FieldDoc {
        name: "expected_store",
        ty: "bool",
        range: "true or false; true needs examples and example_ranker expected",
        doc: "with examples and example_ranker expected: rank each task item's examples from rankings computed once per database (in parallel, when the sampler is made) and stored under rankings/ in its directory, reused while the database, the walk settings and the tasks stay the same; the same batches as computing them per context, at a fraction of the cost (docs/contexts.md)",
    },
    FieldDoc {
        name: "expected_store_rows",
        ty: "int",
        range: "an integer in 1..=65536",
        doc: "with expected_store: rows each stored ranking keeps at most per order (most visits first; latest first), cut between rows of equal rank; a context that reads past them is ranked live (context/store_misses); more rows: fewer misses, a larger file (docs/contexts.md)",
    },
    FieldDoc {
        name: "context_deadline_ms",
        ty: "float | None",
        range: "None or a number in (0, 3600000]",
        doc: "with examples: wall-clock budget of one context's build; a context past it is replaced by the seed's plain BFS context and counted (context/deadline_hits); batches are bit-identical across thread counts whenever no deadline is hit",
    },
    FieldDoc {
        name: "telemetry",
        ty: "bool",
        range: "true or false",
        doc: "record step telemetry (drain API, Prometheus); off only to measure its cost",
    },
    FieldDoc {
        name: "prometheus_port",
        ty: "int | None",
        range: "None or a port in 1..=65535 (plus local_rank still a port)",
        doc: "serve Prometheus /metrics on prometheus_port + local_rank",
    },
    FieldDoc {
        name: "prometheus_host",
        ty: "str",
        range: "an IP address",
        doc: "address the Prometheus exporter binds",
    },
    FieldDoc {
        name: "local_rank",
        ty: "int | None",
        range: "None or an integer in 0..=4294967295",
        doc: "rank within this machine (default: rank); offsets the Prometheus port",
    },
    FieldDoc {
        name: "otlp_endpoint",
        ty: "str | None",
        range: "None or an OTLP/HTTP base URL",
        doc: "export stage spans there (else OTEL_EXPORTER_OTLP_ENDPOINT)",
    },
    FieldDoc {
        name: "stall_after_ms",
        ty: "float | None",
        range: "None (auto: max(2000, 10 x the p99 build time)) or a number in 10..=86400000",
        doc: "a batch build or draw running longer than this (ms) is a stall: the stuck thread's stack is dumped and `stalls` counts it",
    },
    FieldDoc {
        name: "stall_dump_dir",
        ty: "str | None",
        range: "None or a directory path",
        doc: "where stall dumps are written (None: the system temp directory; `headwater train` uses its run directory)",
    },
    FieldDoc {
        name: "pool_fraction",
        ty: "float",
        range: "a number in (0, 1]",
        doc: "keep this share of each seed pool (diagnostic: tiny pools, shard skew)",
    },
    FieldDoc {
        name: "seed_windows",
        ty: "int",
        range: "an integer in 1..=2^32 (1 = off)",
        doc: "read each seed pool in this many windows of consecutive seeds, each epoch still a permutation: with a database preprocessed with `--row-order locality`, a window's contexts lie on about 1/N of its pages, a working set that fits a page cache smaller than the database (sampling guide, Memory)",
    },
    FieldDoc {
        name: "debug_batch_delay_ms",
        ty: "float",
        range: "a number in 0..=60000",
        doc: "fault injection: sleep this long per batch (starves the prefetch queue)",
    },
    FieldDoc {
        name: "debug_repeat_seed_every",
        ty: "int",
        range: "an integer in 0..=2^64-1 (0 = off)",
        doc: "fault injection: every N-th draw of a pool repeats the previous seed (lights invariants/duplicate_seeds)",
    },
    FieldDoc {
        name: "debug_panic_at_step",
        ty: "int | None",
        range: "None or an integer in 0..=2^64-1",
        doc: "fault injection: the producer panics when making this step",
    },
    FieldDoc {
        name: "debug_stall_step",
        ty: "int | None",
        range: "None or an integer in 0..=2^64-1",
        doc: "fault injection: the worker building this training step sleeps debug_stall_ms inside its BFS (a stuck worker)",
    },
    FieldDoc {
        name: "debug_stall_ms",
        ty: "float",
        range: "a number in 0..=600000",
        doc: "fault injection: how long the debug_stall_step worker sleeps (ms)",
    },
    FieldDoc {
        name: "debug_drop_page_cache_every",
        ty: "int",
        range: "an integer in 0..=2^64-1 (0 = off)",
        doc: "fault injection: before every N-th batch the builder drops the database's pages from the process's maps and the page cache (a cold cache)",
    },
    FieldDoc {
        name: "debug_pin_cpu",
        ty: "int | None",
        range: "None or a CPU number this process may run on",
        doc: "fault injection: pin the sampler's threads (producers and pool) to this CPU (CPU-starved when something else keeps it busy)",
    },
    FieldDoc {
        name: "debug_spin_ms",
        ty: "float",
        range: "a number in 0..=60000",
        doc: "fault injection: every batch build burns this much of its thread's CPU time (ms, a busy loop on the thread clock: CPU work, not a sleep)",
    },
    FieldDoc {
        name: "debug_cpu_hog",
        ty: "bool",
        range: "false, or true with debug_pin_cpu set",
        doc: "fault injection: one busy thread (headwater-debug-hog) pinned to debug_pin_cpu for the sampler's lifetime (a CPU-starved sampler)",
    },
];

/// The [`FIELDS`] row of `key`.
pub fn field(key: &str) -> Option<&'static FieldDoc> {
    FIELDS.iter().find(|f| f.name == key)
}

/// The config error for `key` holding `value` (shown as given).
pub fn bad(key: &str, value: impl std::fmt::Display) -> Error {
    let range = field(key).map_or("see the docs", |f| f.range);
    let what = format!("got {value}, allowed: {range}");
    Error::config_value(key, value.to_string(), what)
}

/// The known key closest to the unknown `key` in edit distance, when it
/// is close enough to be a typo (at most a third of its length, at least 1).
pub(super) fn closest(key: &str) -> Option<&'static str> {
    let d = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    let limit = (key.chars().count() / 3).max(1);
    FIELDS
        .iter()
        .map(|f| (d(key, f.name), f.name))
        .filter(|&(dist, _)| dist <= limit)
        .min()
        .map(|(_, name)| name)
}

/// Every key, comma-separated (for the unknown-key error).
pub(super) fn names() -> String {
    FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}
