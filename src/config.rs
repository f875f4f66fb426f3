//! Sampler configuration: the one definition of every sampler key — the
//! `[sampler]` table of training configs, the Python `Sampler(...)` keywords
//! and `config=` mapping (same `snake_case` names), the `.pyi` and the README
//! defaults are all checked against it.
//!
//! A key is one field of [`SamplerConfig`] (its default in `Default`), one
//! row of [`FIELDS`] (type, allowed range, doc) and, if its range is not
//! just its type, one check in [`SamplerConfig::validate`], which is the only
//! check. Input is a JSON-like mapping deserialised once
//! ([`SamplerConfig::from_json`]): unknown keys are rejected naming the key,
//! and a value of the wrong type is reported with the same range text as an
//! out-of-range value of the right type.
//!
//! Invariant: a `SamplerConfig` that passed [`SamplerConfig::validate`] is
//! safe to sample with; every rejection is an [`Error::Config`] naming the
//! key, the value and the allowed range.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the task of each batch is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskPick {
    /// Weighted random by `task_weights` (uniform by default).
    Weighted,
    /// Cycle through the tasks (those with seeds in the split), by step.
    RoundRobin,
}

/// Task weights: a list in metadata order, or a `{task name: weight}`
/// mapping (unlisted tasks keep weight 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskWeights {
    /// One weight per task, metadata order.
    List(Vec<f64>),
    /// Weights by task name.
    ByName(BTreeMap<String, f64>),
}

impl From<Vec<f64>> for TaskWeights {
    fn from(v: Vec<f64>) -> Self {
        TaskWeights::List(v)
    }
}

/// Every sampler key (see the module doc): field order is [`FIELDS`] order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplerConfig {
    /// This process's rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// Train / val / test shares of each task's seeds (sum to 1).
    pub split_ratios: [f64; 3],
    /// Seed of the split hash; independent of `seed`, `rank`, `world_size`.
    pub split_seed: u64,
    /// Seed of all sampling randomness (combined with rank and split).
    pub seed: u64,
    /// Capacity of each prefetch channel (batches).
    pub num_prefetch: usize,
    /// Sequences per batch (B).
    pub default_batch_size: usize,
    /// Cells per sequence (S).
    pub default_sequence_length: usize,
    /// At most this many children sampled per row per hop.
    pub bfs_child_width: usize,
    /// BFS hops from the seed row.
    pub max_hops: usize,
    /// Pack several seeds' contexts into each sequence (segments; see
    /// `crate::batch::pack`). Off: one seed per sequence, the seed layout.
    pub pack: bool,
    /// With `pack`: seeds (segments) per sequence on average, so
    /// `B·pack_factor` seeds per rank per step; 0: per task, as many as
    /// fill `S` on average (`SamplerCore::seeds_per_step`). Ignored without
    /// `pack`.
    pub pack_factor: usize,
    /// Task weights; `None` = uniform.
    pub task_weights: Option<TaskWeights>,
    /// How the task of each batch is chosen.
    pub task_pick: TaskPick,
    /// Database weights of a mixture (a list in the order the databases
    /// were given, or `{database name: weight}`); `None` = uniform.
    pub database_weights: Option<TaskWeights>,
    /// Databases of a mixture with their own telemetry series (the K with
    /// the largest weights; ties by order); the rest are folded into
    /// aggregates and a worst-database pointer. Ignored when
    /// `telemetry_databases` lists databases.
    pub telemetry_top_databases: usize,
    /// Databases of a mixture with their own telemetry series, by name and
    /// in this order; when non-empty the list replaces
    /// `telemetry_top_databases` (K = its length). Empty = the top K.
    pub telemetry_databases: Vec<String>,
    /// Threads in the sampler's pool; `None` = available parallelism.
    pub num_threads: Option<usize>,
    /// Fail fast when the process RSS exceeds this many bytes.
    pub max_rss_bytes: Option<u64>,
    /// What opening the database checks: `header` (O(metadata)) or `full`.
    pub verify: crate::format::Verify,
    /// How the mapped files enter the page cache at open: `lazy`,
    /// `willneed`, `populate` or `mlock` ([`crate::format::PageCache`]).
    pub page_cache: crate::format::PageCache,
    /// Filter children by the seed's observation time. Turning it off is a
    /// diagnostic: the temporal-leak invariant then lights up.
    pub temporal_filter: bool,
    /// Record step telemetry (drain API, Prometheus). Off only to measure
    /// its cost.
    pub telemetry: bool,
    /// Serve Prometheus `/metrics` on `prometheus_port + local_rank`.
    pub prometheus_port: Option<u16>,
    /// Address the exporter binds (loopback by default).
    pub prometheus_host: String,
    /// Rank within this machine (default: `rank`), offsets the port.
    pub local_rank: Option<u32>,
    /// OTLP/HTTP base URL for stage spans (else `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub otlp_endpoint: Option<String>,
    /// Keep this share of each global seed pool (an evenly spaced subset of
    /// the split's seeds, at least one): a diagnostic knob for tiny pools.
    /// Part of the stream: every rank must use the same value (ranks with
    /// different values would read different pools and repeat or skip
    /// seeds; compare `state_dict()["config_hash"]` across ranks).
    pub pool_fraction: f64,
    /// Fault injection: the producer sleeps this long per batch (inside the
    /// timed stage), to simulate a slow sampler and starve the prefetch queue.
    pub debug_batch_delay_ms: f64,
    /// Fault injection: every N-th draw of a pool repeats the seed drawn
    /// before it (0 = off), so `invariants/duplicate_seeds` must fire.
    pub debug_repeat_seed_every: u64,
    /// Fault injection: the producer panics when making this step.
    pub debug_panic_at_step: Option<u64>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            rank: 0,
            world_size: 1,
            split_ratios: [0.8, 0.1, 0.1],
            split_seed: 0,
            seed: 0,
            num_prefetch: 3,
            default_batch_size: 32,
            default_sequence_length: 1024,
            bfs_child_width: 16,
            max_hops: 3,
            pack: false,
            pack_factor: 0,
            task_weights: None,
            task_pick: TaskPick::Weighted,
            database_weights: None,
            telemetry_top_databases: 8,
            telemetry_databases: Vec::new(),
            num_threads: None,
            max_rss_bytes: None,
            verify: crate::format::Verify::Header,
            page_cache: crate::format::PageCache::Lazy,
            temporal_filter: true,
            telemetry: true,
            prometheus_port: None,
            prometheus_host: "127.0.0.1".into(),
            local_rank: None,
            otlp_endpoint: None,
            pool_fraction: 1.0,
            debug_batch_delay_ms: 0.0,
            debug_repeat_seed_every: 0,
            debug_panic_at_step: None,
        }
    }
}

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
    let what = format!("got {value}, allowed: {range}");
    Error::config_value(key, value.to_string(), what)
}

fn names() -> String {
    FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

impl SamplerConfig {
    /// Deserialise a JSON object of keys (missing keys keep their defaults).
    /// Unknown keys and values of the wrong type are [`Error::Config`]
    /// naming the key, the value and the allowed range. Does not validate.
    pub fn from_json(v: &serde_json::Value) -> Result<Self> {
        let obj = v.as_object().ok_or_else(|| {
            Error::config(
                "config",
                format!("expected a mapping of sampler keys, got {v}"),
            )
        })?;
        if let Some(k) = obj.keys().find(|k| field(k).is_none()) {
            return Err(Error::config(
                k.clone(),
                format!("unknown sampler key; known keys: {}", names()),
            ));
        }
        serde_json::from_value(v.clone()).map_err(|_| {
            // Find the key whose value does not deserialise, for the error.
            for (k, val) in obj {
                let one =
                    serde_json::Value::Object([(k.clone(), val.clone())].into_iter().collect());
                if serde_json::from_value::<SamplerConfig>(one).is_err() {
                    return bad(k, val);
                }
            }
            Error::config("config", format!("cannot read {v}"))
        })
    }

    /// This config as a JSON object (every key).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a config serialises")
    }

    /// The task weights in metadata order for a database with `task_names`
    /// (uniform when unset); an unknown task name is a config error.
    pub fn weights_for(&self, task_names: &[String]) -> Result<Vec<f64>> {
        match &self.task_weights {
            None => Ok(vec![1.0; task_names.len()]),
            Some(TaskWeights::List(w)) => Ok(w.clone()),
            Some(TaskWeights::ByName(m)) => {
                if let Some(k) = m.keys().find(|k| !task_names.contains(k)) {
                    return Err(Error::config(
                        "task_weights",
                        format!("unknown task {k:?}; the database's tasks are {task_names:?}"),
                    ));
                }
                Ok(task_names
                    .iter()
                    .map(|t| m.get(t).copied().unwrap_or(1.0))
                    .collect())
            }
        }
    }

    /// Seeds' contexts per sequence on average: `pack_factor` with `pack`
    /// (0: per task, measured when the sampler is made; see
    /// `SamplerCore::seeds_per_step`), else 1.
    pub fn segments_per_sequence(&self) -> usize {
        if self.pack {
            self.pack_factor
        } else {
            1
        }
    }

    /// Check every value; with `task_names` (the database's tasks), also
    /// the task weights against them.
    pub fn validate(&self, task_names: Option<&[String]>) -> Result<()> {
        if self.world_size == 0 {
            return Err(bad("world_size", 0));
        }
        if self.rank >= self.world_size {
            return Err(bad(
                "rank",
                format!("{} with world_size {}", self.rank, self.world_size),
            ));
        }
        let r = self.split_ratios;
        let sum: f64 = r.iter().sum();
        if r.iter().any(|x| !x.is_finite() || *x < 0.0) || (sum - 1.0).abs() > 1e-6 {
            return Err(bad("split_ratios", format!("{r:?} (sum {sum})")));
        }
        let int_range = |key: &str, v: usize, lo: usize, hi: usize| -> Result<()> {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(bad(key, v))
            }
        };
        int_range("num_prefetch", self.num_prefetch, 1, 1024)?;
        int_range("default_batch_size", self.default_batch_size, 1, 65_536)?;
        int_range(
            "default_sequence_length",
            self.default_sequence_length,
            1,
            65_535,
        )?;
        int_range("bfs_child_width", self.bfs_child_width, 1, usize::MAX)?;
        int_range("max_hops", self.max_hops, 0, 64)?;
        int_range("pack_factor", self.pack_factor, 0, 64)?;
        int_range(
            "telemetry_top_databases",
            self.telemetry_top_databases,
            0,
            1024,
        )?;
        self.validate_telemetry_databases()?;
        if let Some(dw) = &self.database_weights {
            let w: Vec<f64> = match dw {
                TaskWeights::List(w) => w.clone(),
                TaskWeights::ByName(m) => m.values().copied().collect(),
            };
            if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(bad("database_weights", format!("a weight of {x}")));
            }
        }
        if let Some(n) = self.num_threads {
            int_range("num_threads", n, 1, 1024)?;
        }
        if self.max_rss_bytes == Some(0) {
            return Err(bad("max_rss_bytes", 0));
        }
        self.validate_weights(task_names)?;
        if let Some(p) = self.prometheus_port {
            let port = u32::from(p) + self.local_rank.unwrap_or(self.rank);
            if p == 0 || port > u32::from(u16::MAX) {
                return Err(bad(
                    "prometheus_port",
                    format!("{p} (+ local rank = {port})"),
                ));
            }
            if self.prometheus_host.parse::<std::net::IpAddr>().is_err() {
                return Err(bad(
                    "prometheus_host",
                    format!("{:?}", self.prometheus_host),
                ));
            }
        }
        if !(self.pool_fraction > 0.0 && self.pool_fraction <= 1.0) {
            return Err(bad("pool_fraction", self.pool_fraction));
        }
        if !(self.debug_batch_delay_ms >= 0.0 && self.debug_batch_delay_ms <= 60_000.0) {
            return Err(bad("debug_batch_delay_ms", self.debug_batch_delay_ms));
        }
        Ok(())
    }

    fn validate_telemetry_databases(&self) -> Result<()> {
        let names = &self.telemetry_databases;
        if names.len() > 1024 {
            return Err(bad(
                "telemetry_databases",
                format!("a list of {} names", names.len()),
            ));
        }
        if let Some(i) = (1..names.len()).find(|&i| names[..i].contains(&names[i])) {
            return Err(bad(
                "telemetry_databases",
                format!("{:?} listed twice in {names:?}", names[i]),
            ));
        }
        Ok(())
    }

    fn validate_weights(&self, task_names: Option<&[String]>) -> Result<()> {
        let Some(tw) = &self.task_weights else {
            return Ok(());
        };
        let w: Vec<f64> = match (tw, task_names) {
            (_, Some(names)) => {
                let w = self.weights_for(names)?;
                if w.len() != names.len() {
                    return Err(bad(
                        "task_weights",
                        format!("{} weights for {} tasks {names:?}", w.len(), names.len()),
                    ));
                }
                w
            }
            (TaskWeights::List(w), None) => w.clone(),
            (TaskWeights::ByName(m), None) => m.values().copied().collect(),
        };
        if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(bad("task_weights", format!("a weight of {x}")));
        }
        if task_names.is_some() && w.iter().all(|&x| x == 0.0) {
            return Err(bad("task_weights", "all weights 0"));
        }
        Ok(())
    }

    /// The effective database weights of a mixture of `db_names` (uniform
    /// when unset): a list must have one weight per database, names must be
    /// databases of the mixture, and at least one weight must be > 0.
    pub fn database_weights_for(&self, db_names: &[String]) -> Result<Vec<f64>> {
        let w = match &self.database_weights {
            None => vec![1.0; db_names.len()],
            Some(TaskWeights::List(w)) => {
                if w.len() != db_names.len() {
                    return Err(bad(
                        "database_weights",
                        format!(
                            "{} weights for {} databases {db_names:?}",
                            w.len(),
                            db_names.len()
                        ),
                    ));
                }
                w.clone()
            }
            Some(TaskWeights::ByName(m)) => {
                if let Some(k) = m.keys().find(|k| !db_names.contains(k)) {
                    return Err(Error::config(
                        "database_weights",
                        format!("unknown database {k:?}; the mixture's databases are {db_names:?}"),
                    ));
                }
                db_names
                    .iter()
                    .map(|d| m.get(d).copied().unwrap_or(1.0))
                    .collect()
            }
        };
        if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(bad("database_weights", format!("a weight of {x}")));
        }
        if w.iter().all(|&x| x == 0.0) {
            return Err(bad("database_weights", "all weights 0"));
        }
        Ok(w)
    }

    /// The mixture indices of the `telemetry_databases` of a mixture of
    /// `db_names`, in the order listed; `None` when the list is empty (the
    /// top `telemetry_top_databases` by weight report instead). A name that
    /// is not a database of the mixture is a config error naming it and
    /// the mixture's databases.
    pub fn telemetry_databases_for(&self, db_names: &[String]) -> Result<Option<Vec<usize>>> {
        if self.telemetry_databases.is_empty() {
            return Ok(None);
        }
        self.telemetry_databases
            .iter()
            .map(|name| {
                db_names.iter().position(|d| d == name).ok_or_else(|| {
                    Error::config(
                        "telemetry_databases",
                        format!(
                            "unknown database {name:?}; the mixture's databases are {db_names:?}"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// The exporter address for this rank, when Prometheus is on.
    pub fn prometheus_addr(&self) -> Option<std::net::SocketAddr> {
        let p = u32::from(self.prometheus_port?) + self.local_rank.unwrap_or(self.rank);
        let ip: std::net::IpAddr = self.prometheus_host.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, u16::try_from(p).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    #[test]
    fn fields_are_the_struct_in_order() {
        let v = SamplerConfig::default().to_json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want: Vec<&str> = FIELDS.iter().map(|f| f.name).collect();
        let mut got = keys.clone();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn rejections_name_the_key() {
        let ok = SamplerConfig::default();
        ok.validate(Some(&names(2))).unwrap();
        let cases: Vec<(SamplerConfig, &str)> = vec![
            (
                SamplerConfig {
                    rank: 2,
                    world_size: 2,
                    ..ok.clone()
                },
                "rank",
            ),
            (
                SamplerConfig {
                    split_ratios: [0.5, 0.1, 0.1],
                    ..ok.clone()
                },
                "split_ratios",
            ),
            (
                SamplerConfig {
                    default_batch_size: 0,
                    ..ok.clone()
                },
                "default_batch_size",
            ),
            (
                SamplerConfig {
                    default_sequence_length: 0,
                    ..ok.clone()
                },
                "default_sequence_length",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![1.0].into()),
                    ..ok.clone()
                },
                "task_weights",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![1.0, -1.0].into()),
                    ..ok.clone()
                },
                "task_weights",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![0.0, 0.0].into()),
                    ..ok.clone()
                },
                "task_weights",
            ),
        ];
        for (c, key) in cases {
            match c.validate(Some(&names(2))) {
                Err(Error::Config { key: k, what, .. }) => {
                    assert_eq!(k, key);
                    assert!(what.contains(field(key).unwrap().range), "{what}");
                }
                other => panic!("{key}: expected Config, got {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_type_and_out_of_range_give_the_same_range() {
        let neg = SamplerConfig::from_json(&serde_json::json!({"default_batch_size": -1}))
            .unwrap_err()
            .to_string();
        let zero = SamplerConfig::from_json(&serde_json::json!({"default_batch_size": 0}))
            .unwrap()
            .validate(None)
            .unwrap_err()
            .to_string();
        let range = field("default_batch_size").unwrap().range;
        assert!(neg.contains(range) && neg.contains("-1"), "{neg}");
        assert!(zero.contains(range) && zero.contains("got 0"), "{zero}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = SamplerConfig::from_json(&serde_json::json!({"rank": 0, "bogus": 1})).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    #[test]
    fn weights_by_name_fill_unlisted_tasks_and_name_unknown_ones() {
        let c =
            SamplerConfig::from_json(&serde_json::json!({"task_weights": {"t1": 3.0}})).unwrap();
        assert_eq!(c.weights_for(&names(3)).unwrap(), vec![1.0, 3.0, 1.0]);
        let c =
            SamplerConfig::from_json(&serde_json::json!({"task_weights": {"nope": 3.0}})).unwrap();
        let e = c.validate(Some(&names(2))).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("task_weights"), "{e}");
    }

    #[test]
    fn telemetry_databases_are_distinct_bounded_and_names_of_the_mixture() {
        let dbs: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let listed = |names: &[&str]| SamplerConfig {
            telemetry_databases: names.iter().map(|n| (*n).to_string()).collect(),
            ..SamplerConfig::default()
        };
        let c = listed(&["c", "a"]);
        c.validate(None).unwrap();
        assert_eq!(c.telemetry_databases_for(&dbs).unwrap(), Some(vec![2, 0]));
        let none = SamplerConfig::default();
        assert_eq!(none.telemetry_databases_for(&dbs).unwrap(), None);
        let range = field("telemetry_databases").unwrap().range;
        let e = listed(&["a", "b", "a"])
            .validate(None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`telemetry_databases`")
                && e.contains("\"a\" listed twice")
                && e.contains(range),
            "{e}"
        );
        let many: Vec<String> = (0..1025).map(|i| format!("d{i}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = listed(&names).validate(None).unwrap_err().to_string();
        assert!(
            e.contains("a list of 1025 names") && e.contains(range),
            "{e}"
        );
        listed(&names[..1024]).validate(None).unwrap();
        let e = listed(&["b", "nope"])
            .telemetry_databases_for(&dbs)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`telemetry_databases`")
                && e.contains("unknown database \"nope\"")
                && e.contains(r#"["a", "b", "c"]"#),
            "{e}"
        );
    }
}
