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

const fn f(
    name: &'static str,
    ty: &'static str,
    range: &'static str,
    doc: &'static str,
) -> FieldDoc {
    FieldDoc {
        name,
        ty,
        range,
        doc,
    }
}

/// Every key of [`SamplerConfig`], in field order (a test keeps them equal).
pub static FIELDS: [FieldDoc; 31] = [
    f("rank", "int", "an integer in 0..world_size", "this process's rank"),
    f("world_size", "int", "an integer in 1..=4294967295", "number of ranks"),
    f(
        "split_ratios",
        "tuple[float, float, float]",
        "three finite numbers >= 0 that sum to 1",
        "train / val / test shares of each task's seeds (hash split; not for a task with stored splits, e.g. RelBench)",
    ),
    f(
        "split_seed",
        "int",
        "an integer in 0..=2^64-1",
        "seed of the split hash (independent of seed, rank, world_size)",
    ),
    f(
        "seed",
        "int",
        "an integer in 0..=2^64-1",
        "seed of all sampling randomness (combined with rank and split)",
    ),
    f(
        "num_prefetch",
        "int",
        "an integer in 1..=1024",
        "capacity of each prefetch channel (batches)",
    ),
    f(
        "default_batch_size",
        "int",
        "an integer in 1..=65536",
        "sequences per batch (B)",
    ),
    f(
        "default_sequence_length",
        "int",
        "an integer in 1..=65535 (cell positions are u16)",
        "cells per sequence (S)",
    ),
    f(
        "bfs_child_width",
        "int",
        "an integer in 1..=2^64-1",
        "at most this many children sampled per row per hop",
    ),
    f("max_hops", "int", "an integer in 0..=64", "BFS hops from the seed row"),
    f(
        "pack",
        "bool",
        "true or false",
        "pack pack_factor seeds' contexts into each sequence (segment-masked)",
    ),
    f(
        "pack_factor",
        "int",
        "an integer in 0..=64, with pack: pack_factor x the largest seed row <= default_sequence_length",
        "with pack: seeds (segments) per sequence on average; 0 = per task, as many as fill S on average (mean context size measured on a probe of the task's seeds at start-up); contexts are balanced over the sequences and only those above a water level are cut",
    ),
    f(
        "task_weights",
        "list[float] | dict[str, float] | None",
        "None, one finite weight >= 0 per task (metadata order), or {task name: weight} (unlisted tasks keep 1); at least one > 0",
        "task weights for weighted picking (None = uniform)",
    ),
    f(
        "task_pick",
        "str",
        "\"weighted\" or \"round_robin\"",
        "how the task of each batch is chosen",
    ),
    f(
        "database_weights",
        "list[float] | dict[str, float] | None",
        "None, one finite weight >= 0 per database (the order given), or {database name: weight} (unlisted databases keep 1); at least one > 0",
        "share of batches per database of a mixture (None = uniform over databases)",
    ),
    f(
        "telemetry_top_databases",
        "int",
        "an integer in 0..=1024",
        "databases of a mixture with their own telemetry series (largest weights; ignored when telemetry_databases is set); the rest are folded into aggregates",
    ),
    f(
        "telemetry_databases",
        "list[str]",
        "a list of at most 1024 distinct database names of the mixture ([] = the telemetry_top_databases largest weights)",
        "databases of a mixture with their own telemetry series, in this order (replaces telemetry_top_databases when not empty); the rest are folded into aggregates",
    ),
    f(
        "num_threads",
        "int | None",
        "None or an integer in 1..=1024",
        "threads in the sampler's pool (None = available parallelism)",
    ),
    f(
        "max_rss_bytes",
        "int | None",
        "None or an integer in 1..=2^64-1",
        "fail fast when the process RSS exceeds this many bytes",
    ),
    f(
        "verify",
        "str",
        "\"header\" or \"full\"",
        "open check: header (sizes + metadata hash, O(metadata)) or full (also every payload checksum)",
    ),
    f(
        "page_cache",
        "str",
        "\"lazy\", \"willneed\", \"populate\" or \"mlock\"",
        "at open: lazy (page faults), willneed (madvise read-ahead), populate (fault every page in), mlock (populate and lock; needs RLIMIT_MEMLOCK); the last three also advise huge pages",
    ),
    f(
        "temporal_filter",
        "bool",
        "true or false",
        "filter children by the seed's observation time (off: the temporal-leak invariant lights up)",
    ),
    f(
        "telemetry",
        "bool",
        "true or false",
        "record step telemetry (drain API, Prometheus); off only to measure its cost",
    ),
    f(
        "prometheus_port",
        "int | None",
        "None or a port in 1..=65535 (plus local_rank still a port)",
        "serve Prometheus /metrics on prometheus_port + local_rank",
    ),
    f(
        "prometheus_host",
        "str",
        "an IP address",
        "address the Prometheus exporter binds",
    ),
    f(
        "local_rank",
        "int | None",
        "None or an integer in 0..=4294967295",
        "rank within this machine (default: rank); offsets the Prometheus port",
    ),
    f(
        "otlp_endpoint",
        "str | None",
        "None or an OTLP/HTTP base URL",
        "export stage spans there (else OTEL_EXPORTER_OTLP_ENDPOINT)",
    ),
    f(
        "pool_fraction",
        "float",
        "a number in (0, 1]",
        "keep this share of each seed pool (diagnostic: tiny pools, shard skew)",
    ),
    f(
        "debug_batch_delay_ms",
        "float",
        "a number in 0..=60000",
        "fault injection: sleep this long per batch (starves the prefetch queue)",
    ),
    f(
        "debug_repeat_seed_every",
        "int",
        "an integer in 0..=2^64-1 (0 = off)",
        "fault injection: every N-th draw of a pool repeats the previous seed (lights invariants/duplicate_seeds)",
    ),
    f(
        "debug_panic_at_step",
        "int | None",
        "None or an integer in 0..=2^64-1",
        "fault injection: the producer panics when making this step",
    ),
];

/// The [`FIELDS`] row of `key`.
pub fn field(key: &str) -> Option<&'static FieldDoc> {
    FIELDS.iter().find(|f| f.name == key)
}

/// The config error for `key` holding `value` (shown as given).
pub fn bad(key: &str, value: impl std::fmt::Display) -> Error {
    let range = field(key).map_or("see the docs", |f| f.range);
    Error::Config {
        key: key.to_string(),
        what: format!("got {value}, allowed: {range}"),
    }
}

/// Every key, comma-separated (for the unknown-key error).
pub(super) fn names() -> String {
    FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}
