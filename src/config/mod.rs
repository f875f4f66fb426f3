//! Sampler configuration: the one definition of every sampler key — the
//! `[sampler]` table of training configs, the Python `Sampler(...)` keywords
//! and `config=` mapping (same `snake_case` names), the `.pyi` and the README
//! defaults are all checked against it.
//!
//! A key is one field of [`SamplerConfig`] (its default in `Default`) and
//! one row of [`FIELDS`] (type, group, its check as data, doc); only a rule
//! over several keys adds a function to [`SamplerConfig::validate`], which
//! is the only check. Input is a JSON-like mapping deserialised once
//! ([`SamplerConfig::from_json`]): unknown keys are rejected naming the key,
//! and a value of the wrong type is reported with the same range text as an
//! out-of-range value of the right type.
//!
//! Invariant: a `SamplerConfig` that passed [`SamplerConfig::validate`] is
//! safe to sample with; every rejection is an [`Error::Config`] naming the
//! key, the value and the allowed range.
//!
//! Files: this one holds the config types, parsing and the accessors;
//! `keys.rs` the [`FIELDS`] data table (one row per key), `fields.rs` what
//! a row is (its check as data, the range text made from it), `lookup.rs`
//! the lookups and errors made from the table; `shape.rs` each step's
//! `(S, B)`; `validate.rs`
//! [`SamplerConfig::validate`]; `resolve.rs` the values resolved against a
//! database or mixture (weights by name, telemetry databases).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod fields;
mod keys;
mod lookup;
mod recipe;
mod resolve;
mod shape;
mod validate;

pub use fields::{Check, FieldDoc, Group};
pub use keys::FIELDS;
use lookup::names;
pub use lookup::{bad, field};
pub use recipe::Recipe;
pub use shape::StepShape;

/// How the task of each batch is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskPick {
    /// Weighted random by `task_weights` (uniform by default).
    Weighted,
    /// Cycle through the tasks (those with seeds in the split), by step.
    RoundRobin,
}

/// Whether a step has one task or each sequence draws its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskMixing {
    /// One task per step (on every rank), picked by `task_pick`.
    #[default]
    Step,
    /// Each sequence draws its own (database, task) by the task weights.
    Sequence,
}

/// What a mixture does with a database that fails to open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadDatabase {
    /// Fail the open, naming the database and why.
    #[default]
    Error,
    /// Drop it with one line naming it and why, and share its weight out
    /// among the others (`databases/dropped`; a saved state remembers it).
    Skip,
}

/// How tier-1 examples of an in-context context are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExampleRanker {
    /// Visit counts of random walks from the seed (RT-J's semantics).
    Walks,
    /// The same walks in blocks, stopped once the examples the context
    /// would take are stable (`crate::ranking::rankers`).
    Adaptive,
    /// The visit counts the walks are expected to give, computed without
    /// drawing a walk (`crate::ranking::expected`).
    Expected,
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
/// Its bools are independent switches, one key each (the config table).
#[allow(clippy::struct_excessive_bools)]
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
    /// Variable length: each stream step draws its `S` from this list
    /// (`SamplerCore::step_shape`); empty = every step has
    /// `default_sequence_length`.
    pub sequence_lengths: Vec<usize>,
    /// With `sequence_lengths`: cells per rank per step, `B = tokens / S`.
    pub tokens_per_batch: Option<usize>,
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
    /// One task per step (`step`, the default) or per sequence
    /// (`sequence`: a batch mixes tasks, and databases of a mixture).
    pub task_mixing: TaskMixing,
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
    /// A database of a mixture that fails to open: `error` (the open
    /// fails) or `skip` (it is dropped and its weight shared out).
    pub on_bad_database: OnBadDatabase,
    /// Node-local folder each database is copied to (verified, once per
    /// host, resumable) and read from (`crate::format::stage`); `None`:
    /// read in place.
    pub stage_dir: Option<String>,
    /// Threads in the sampler's pool; `None` = available parallelism.
    pub num_threads: Option<usize>,
    /// Fail fast when the process RSS exceeds this many bytes.
    pub max_rss_bytes: Option<u64>,
    /// Bytes of memory, page cache included, the sampler plans its reads
    /// for; `None` = the memory cgroup's limit, else the host's memory
    /// ([`crate::format::memory_limit_bytes`]). Databases whose files add
    /// up to more than 1.1 times it are read without read-ahead.
    pub memory_budget: Option<u64>,
    /// What opening the database checks: `header` (O(metadata)) or `full`.
    pub verify: crate::format::Verify,
    /// How the mapped files enter the page cache at open: `lazy`,
    /// `willneed`, `populate` or `mlock` ([`crate::format::PageCache`]).
    pub page_cache: crate::format::PageCache,
    /// Filter children by the seed's observation time. Turning it off is a
    /// diagnostic: the temporal-leak invariant then lights up.
    pub temporal_filter: bool,
    /// A named set of keys (`"rt-j"`), applied to the keys not given
    /// ([`Recipe`]); `None`: every key as given or by default.
    pub recipe: Option<Recipe>,
    /// In-context contexts (`crate::context::incontext`): tier 0 the seed's
    /// BFS, tier 1 labelled rows of the seed's table ranked by
    /// `example_ranker`, tier 2 random ones. Off: the plain layout (the seed's BFS only).
    pub examples: bool,
    /// With `examples`: the per-sequence choices of the BFS cell budget of
    /// the seed and of each example.
    pub local_context_sizes: Vec<usize>,
    /// With `examples`: the per-sequence choices of the BFS child width.
    pub bfs_widths: Vec<usize>,
    /// With `examples`: the per-sequence choices of recency-first ranking.
    pub prefer_latest: Vec<bool>,
    /// With `examples`: random walks per context (0: no walks).
    pub num_walks: usize,
    /// With `examples`: rows each walk visits, the seed first.
    pub walk_length: usize,
    /// Highest per-sequence probability of masking a cell (as an extra
    /// target; with or without `examples`; 0: no masking).
    pub mask_prob_max: f64,
    /// With `examples`: how tier-1 examples are ranked.
    pub example_ranker: ExampleRanker,
    /// With `example_ranker = "expected"`: a row spreads its probability
    /// only when each neighbour's share is at least this many expected
    /// visits of `num_walks` walks (`crate::ranking::expected`).
    pub expected_prune: f64,
    /// With `example_ranker = "expected"`: rank from rankings computed
    /// once per database and stored in its directory
    /// (`crate::ranking::rank_store`; the same picks).
    pub expected_store: bool,
    /// With `expected_store`: rows each stored head (the count order, the
    /// recency order) of an item keeps at most.
    pub expected_store_rows: usize,
    /// With `examples`: wall-clock budget of one context's build (ms).
    pub context_deadline_ms: Option<f64>,
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
    /// A batch build or draw running longer than this (ms) is a stall: its
    /// thread's stack is dumped and `stalls` counts it. `None`: 10 × the
    /// p99 of recent builds, at least 2000 ms (`crate::stalls`).
    pub stall_after_ms: Option<f64>,
    /// Where stall dumps are written (`None`: the system temp directory;
    /// `headwater train` sets its run directory).
    pub stall_dump_dir: Option<String>,
    /// Keep this share of each global seed pool (an evenly spaced subset of
    /// the split's seeds, at least one): a diagnostic knob for tiny pools.
    /// Part of the stream: every rank must use the same value (ranks with
    /// different values would read different pools and repeat or skip
    /// seeds; compare `state_dict()["config_hash"]` across ranks).
    pub pool_fraction: f64,
    /// Read each seed pool in this many windows of consecutive seeds (1 =
    /// off): every epoch is still a permutation of the pool, window after
    /// window in a keyed order, so a database written with
    /// `row_order = "locality"` is read about `1/seed_windows` of it at a
    /// time and a working set that fits a small page cache. Part of the
    /// stream, like `pool_fraction`.
    pub seed_windows: usize,
    /// Hot sets (`crate::seeds::HotSets`): cut the mixture's databases, in
    /// order, into groups of at most this many bytes on disk and train on
    /// one group at a time, each for its weight's share of every
    /// `hot_set_steps` (None: off). The same on every rank (it decides
    /// every step's tasks): part of the stream.
    pub hot_set_bytes: Option<u64>,
    /// Train steps of one cycle through the hot sets. Part of the stream
    /// with `hot_set_bytes`.
    pub hot_set_steps: u64,
    /// Fault injection: the producer sleeps this long per batch (inside the
    /// timed stage), to simulate a slow sampler and starve the prefetch queue.
    pub debug_batch_delay_ms: f64,
    /// Fault injection: every N-th draw of a pool repeats the seed drawn
    /// before it (0 = off), so `invariants/duplicate_seeds` must fire.
    pub debug_repeat_seed_every: u64,
    /// Fault injection: a forecast task's items are examples once merely
    /// observed before the seed (`t′ < t`, RT-J's rule), their label
    /// windows ignored, so `invariants/label_leaks` must fire.
    pub debug_ignore_window: bool,
    /// Fault injection: the producer panics when making this step.
    pub debug_panic_at_step: Option<u64>,
    /// Fault injection: the worker building this training step sleeps
    /// `debug_stall_ms` inside its BFS (a stuck worker for the stall
    /// detector).
    pub debug_stall_step: Option<u64>,
    /// Fault injection: how long that worker sleeps (ms).
    pub debug_stall_ms: f64,
    /// Fault injection: before every N-th batch (0 = off) the builder drops
    /// the database's pages from this process's maps and the page cache,
    /// as the kernel does for a database larger than the page cache.
    pub debug_drop_page_cache_every: u64,
    /// Fault injection: a page cache that holds this many bytes of the
    /// databases (`None` = off): before each batch the databases read least
    /// recently are dropped until those kept fit (`crate::faults::SmallCache`).
    pub debug_page_cache_bytes: Option<u64>,
    /// Fault injection: pin the sampler's threads (producers and pool) to
    /// this CPU (a CPU-starved sampler when something else keeps it busy).
    pub debug_pin_cpu: Option<u32>,
    /// Fault injection: every batch build burns this much of its thread's
    /// CPU time (ms, a busy loop on the thread clock, not a sleep): CPU work
    /// that competes for the core, a slow sampler made of computation.
    pub debug_spin_ms: f64,
    /// Fault injection: with `debug_pin_cpu`, one busy thread
    /// (`headwater-debug-hog`) pinned to that CPU for the sampler's
    /// lifetime: the sampler's threads runnable but not running.
    pub debug_cpu_hog: bool,
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
            sequence_lengths: Vec::new(),
            tokens_per_batch: None,
            bfs_child_width: 16,
            max_hops: 3,
            pack: false,
            pack_factor: 0,
            task_weights: None,
            task_pick: TaskPick::Weighted,
            task_mixing: TaskMixing::Step,
            database_weights: None,
            telemetry_top_databases: 8,
            telemetry_databases: Vec::new(),
            on_bad_database: OnBadDatabase::Error,
            stage_dir: None,
            num_threads: None,
            max_rss_bytes: None,
            memory_budget: None,
            verify: crate::format::Verify::Header,
            page_cache: crate::format::PageCache::Lazy,
            temporal_filter: true,
            recipe: None,
            examples: false,
            local_context_sizes: vec![256, 512, 1024],
            bfs_widths: vec![8, 16, 32, 64, 128, 256],
            prefer_latest: vec![false, true],
            num_walks: 10_000,
            walk_length: 20,
            mask_prob_max: 0.0,
            example_ranker: ExampleRanker::Walks,
            expected_prune: 0.25,
            expected_store: false,
            expected_store_rows: 96,
            context_deadline_ms: None,
            telemetry: true,
            prometheus_port: None,
            prometheus_host: "127.0.0.1".into(),
            local_rank: None,
            otlp_endpoint: None,
            stall_after_ms: None,
            stall_dump_dir: None,
            pool_fraction: 1.0,
            seed_windows: 1,
            hot_set_bytes: None,
            hot_set_steps: 1000,
            debug_batch_delay_ms: 0.0,
            debug_repeat_seed_every: 0,
            debug_ignore_window: false,
            debug_panic_at_step: None,
            debug_stall_step: None,
            debug_stall_ms: 0.0,
            debug_drop_page_cache_every: 0,
            debug_page_cache_bytes: None,
            debug_pin_cpu: None,
            debug_spin_ms: 0.0,
            debug_cpu_hog: false,
        }
    }
}

impl SamplerConfig {
    /// Masked-cell target slots per sequence (`M`): `ceil(mask_prob_max ·
    /// S)`, 0 without masking. A sequence masks at most `M` cells.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    pub fn mask_slots(&self) -> usize {
        self.mask_slots_at(self.default_sequence_length)
    }

    /// [`mask_slots`](Self::mask_slots) of a step of `s` cells per sequence.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    pub fn mask_slots_at(&self, s: usize) -> usize {
        (self.mask_prob_max * s as f64).ceil() as usize
    }
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
            let hint =
                lookup::closest(k).map_or(String::new(), |c| format!("did you mean `{c}`? "));
            return Err(Error::config(
                k.clone(),
                format!("unknown sampler key; {hint}known keys: {}", names()),
            ));
        }
        let mut cfg: SamplerConfig = serde_json::from_value(v.clone()).map_err(|_| {
            // Find the key whose value does not deserialise, for the error.
            for (k, val) in obj {
                let one =
                    serde_json::Value::Object([(k.clone(), val.clone())].into_iter().collect());
                if serde_json::from_value::<SamplerConfig>(one).is_err() {
                    return bad(k, val);
                }
            }
            Error::config("config", format!("cannot read {v}"))
        })?;
        cfg.apply_recipe(&|k| obj.contains_key(k));
        Ok(cfg)
    }

    /// `self` with the keys of `over` set over it, each checked as
    /// [`SamplerConfig::from_json`] checks it; a `recipe` in `over` sets its
    /// keys that `over` does not give (those of `self` are defaults here,
    /// not choices).
    pub fn with_keys(&self, over: &serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let mut all = self.to_json();
        if let serde_json::Value::Object(m) = &mut all {
            m.extend(over.clone());
        }
        let mut cfg = Self::from_json(&all)?;
        cfg.apply_recipe(&|k| over.contains_key(k));
        Ok(cfg)
    }

    /// This config as a JSON object (every key).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a config serialises")
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
    fn wrong_type_and_out_of_range_give_the_same_range() {
        let neg = SamplerConfig::from_json(&serde_json::json!({"default_batch_size": -1}))
            .unwrap_err()
            .to_string();
        let zero = SamplerConfig::from_json(&serde_json::json!({"default_batch_size": 0}))
            .unwrap()
            .validate(None)
            .unwrap_err()
            .to_string();
        let range = &*field("default_batch_size").unwrap().range();
        assert!(neg.contains(range) && neg.contains("-1"), "{neg}");
        assert!(zero.contains(range) && zero.contains("got 0"), "{zero}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = SamplerConfig::from_json(&serde_json::json!({"rank": 0, "bogus": 1})).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        assert!(!e.to_string().contains("did you mean"), "{e}");
        let e = SamplerConfig::from_json(&serde_json::json!({"num_thread": 2})).unwrap_err();
        assert!(e.to_string().contains("did you mean `num_threads`?"), "{e}");
        let e = SamplerConfig::from_json(&serde_json::json!({"task_weigths": [1]})).unwrap_err();
        assert!(
            e.to_string().contains("did you mean `task_weights`?"),
            "{e}"
        );
    }
}
