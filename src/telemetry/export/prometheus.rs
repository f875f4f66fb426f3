//! Prometheus: the same measurements as the drain API, as cumulative series
//! on `/metrics` (via `metrics` + `metrics-exporter-prometheus`).
//!
//! Names are `headwater_<subsystem>_<quantity>_<unit>` in base units,
//! counters end in `_total`, histograms are bucketed (so PromQL can sum them
//! across ranks); labels are only `rank`, `split` and `task`. Series per
//! process: 2 splits × (8 gauges + 7 counters + T task counters + Σ over the
//! 8 histograms of (buckets + 2)) — they grow with the number of tasks T only.
//! Handles are registered once per sampler and cached; recording is atomic
//! increments, and scrapes read the atomics on the exporter's own thread,
//! never blocking the sampler.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

use metrics::{
    describe_counter, describe_gauge, describe_histogram, Counter, Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::telemetry::TelemetrySchema;

/// Every Prometheus name, with the drain key it mirrors.
pub const GAUGES: [(&str, &str, Unit); 8] = [
    (
        "headwater_pool_remaining_min_seeds",
        "pool/remaining_min",
        Unit::Count,
    ),
    (
        "headwater_pool_remaining_max_seeds",
        "pool/remaining_max",
        Unit::Count,
    ),
    (
        "headwater_pool_remaining_fraction_min_ratio",
        "pool/remaining_fraction_min",
        Unit::Percent,
    ),
    (
        "headwater_pool_remaining_fraction_max_ratio",
        "pool/remaining_fraction_max",
        Unit::Percent,
    ),
    (
        "headwater_pool_steps_since_pick_max_batches",
        "pool/steps_since_pick_max",
        Unit::Count,
    ),
    (
        "headwater_pool_steps_to_exhaust_min_batches",
        "pool/steps_to_exhaust_min",
        Unit::Count,
    ),
    (
        "headwater_mix_tv_distance_ratio",
        "mix/tv_distance",
        Unit::Percent,
    ),
    (
        "headwater_queue_depth_batches",
        "queue/depth_min",
        Unit::Count,
    ),
];
pub const COUNTERS: [(&str, &str); 7] = [
    ("headwater_pool_exhaust_events_total", "pool/exhaust_events"),
    (
        "headwater_truncation_cells_dropped_total",
        "truncation/cells_dropped",
    ),
    ("headwater_bfs_children_capped_total", "bfs/children_capped"),
    (
        "headwater_bfs_temporal_filtered_total",
        "bfs/temporal_filtered",
    ),
    (
        "headwater_invariant_duplicate_seeds_total",
        "invariants/duplicate_seeds",
    ),
    (
        "headwater_invariant_temporal_leaks_total",
        "invariants/temporal_leaks",
    ),
    ("headwater_batches_delivered_total", "batches"),
];
pub const TASK_COUNTER: &str = "headwater_task_seeds_drawn_total";
pub const HISTOGRAMS: [(&str, &str, Unit); 8] = [
    ("headwater_bfs_depth_hops", "bfs/depth", Unit::Count),
    ("headwater_bfs_sequence_rows", "bfs/rows", Unit::Count),
    (
        "headwater_padding_fraction_ratio",
        "padding/fraction",
        Unit::Percent,
    ),
    (
        "headwater_queue_wait_seconds",
        "queue/wait_seconds",
        Unit::Seconds,
    ),
    (
        "headwater_stage_bfs_seconds",
        "stage/bfs_seconds",
        Unit::Seconds,
    ),
    (
        "headwater_stage_assemble_seconds",
        "stage/assemble_seconds",
        Unit::Seconds,
    ),
    (
        "headwater_stage_collate_seconds",
        "stage/collate_seconds",
        Unit::Seconds,
    ),
    (
        "headwater_stage_total_seconds",
        "stage/total_seconds",
        Unit::Seconds,
    ),
];

fn help(schema: &TelemetrySchema, key: &str) -> &'static str {
    schema
        .entry(&format!("{}{key}", crate::telemetry::PREFIX))
        .map(|e| e.help)
        .unwrap_or("time the consumer blocked per call (seconds)")
}

static INSTALLED: OnceLock<Mutex<Option<SocketAddr>>> = OnceLock::new();

/// Install the process-wide exporter listening on `addr` (once per
/// process; a second call with the same address is a no-op).
pub fn install(addr: SocketAddr, schema: &TelemetrySchema) -> Result<()> {
    let slot = INSTALLED.get_or_init(|| Mutex::new(None));
    let mut g = slot.lock().unwrap();
    if let Some(existing) = *g {
        if existing == addr {
            return Ok(());
        }
        return Err(Error::Config {
            key: "prometheus_port".into(),
            what: format!("this process already exports on {existing}; one exporter per process (asked for {addr})"),
        });
    }
    let mut b = PrometheusBuilder::new().with_http_listener(addr);
    for (name, key, _) in HISTOGRAMS {
        let edges: Vec<f64> = match key {
            "queue/wait_seconds" => crate::telemetry::schema_seconds_edges()
                .iter()
                .copied()
                .filter(|e| e.is_finite())
                .collect(),
            _ => schema
                .entry(&format!("{}{key}", crate::telemetry::PREFIX))
                .and_then(|e| e.edges.clone())
                .expect("histogram key in schema")
                .iter()
                .copied()
                .filter(|e| e.is_finite())
                .collect(),
        };
        b = b
            .set_buckets_for_metric(Matcher::Full(name.to_string()), &edges)
            .map_err(|e| Error::Config {
                key: "prometheus".into(),
                what: e.to_string(),
            })?;
    }
    b.install().map_err(|e| Error::Config {
        key: "prometheus_port".into(),
        what: format!("cannot serve /metrics on {addr}: {e}"),
    })?;
    for (name, key, unit) in GAUGES {
        describe_gauge!(name, unit, help(schema, key));
    }
    for (name, key) in COUNTERS {
        describe_counter!(name, Unit::Count, help(schema, key));
    }
    describe_counter!(TASK_COUNTER, Unit::Count, "seeds drawn for the task");
    for (name, key, unit) in HISTOGRAMS {
        describe_histogram!(name, unit, help(schema, key));
    }
    *g = Some(addr);
    Ok(())
}

/// Cached handles for one split of one sampler.
pub struct PromSplit {
    gauges: Vec<Gauge>,
    counters: Vec<Counter>,
    tasks: Vec<Counter>,
    hists: Vec<Histogram>,
}

impl PromSplit {
    pub fn register(schema: &TelemetrySchema, rank: u32, split: &'static str) -> Self {
        let rank = rank.to_string();
        let labels = || vec![("rank", rank.clone()), ("split", split.to_string())];
        PromSplit {
            gauges: GAUGES
                .iter()
                .map(|(n, _, _)| metrics::gauge!(*n, &labels()))
                .collect(),
            counters: COUNTERS
                .iter()
                .map(|(n, _)| metrics::counter!(*n, &labels()))
                .collect(),
            tasks: schema
                .task_names
                .iter()
                .map(|t| {
                    let mut l = labels();
                    l.push(("task", t.clone()));
                    metrics::counter!(TASK_COUNTER, &l)
                })
                .collect(),
            hists: HISTOGRAMS
                .iter()
                .map(|(n, _, _)| metrics::histogram!(*n, &labels()))
                .collect(),
        }
    }

    /// Mirror one delivered batch (the same numbers the drain recorder sees).
    pub fn record(&self, b: &Batch, depth: usize, wait_seconds: f64) {
        let t = &b.telemetry;
        let g = [
            t.remaining_min,
            t.remaining_max,
            t.remaining_fraction_min,
            t.remaining_fraction_max,
            t.steps_since_pick_max,
            t.steps_to_exhaust_min,
            t.tv_distance,
            depth as f64,
        ];
        for (h, v) in self.gauges.iter().zip(g) {
            h.set(v);
        }
        let mut dropped = 0;
        let mut capped = 0;
        let mut filtered = 0;
        let mut leaks = 0;
        let s = b.seq_len as f64;
        for q in &b.seq_stats {
            dropped += q.cells_dropped;
            capped += q.children_capped;
            filtered += q.temporal_filtered;
            leaks += q.temporal_leaks;
            self.hists[0].record(q.depth as f64);
            self.hists[1].record(q.rows as f64);
            self.hists[2].record(1.0 - q.cells as f64 / s);
        }
        let c = [
            b.exhaust_events as u64,
            dropped,
            capped,
            filtered,
            b.duplicate_seeds as u64,
            leaks,
            1,
        ];
        for (h, v) in self.counters.iter().zip(c) {
            h.increment(v);
        }
        if let Some(h) = self.tasks.get(b.task_idx as usize) {
            h.increment(b.batch_size as u64);
        }
        self.hists[3].record(wait_seconds);
        for (h, ns) in self.hists[4..].iter().zip(b.stage_ns) {
            h.record(ns as f64 * 1e-9);
        }
    }
}
