//! The ordered list of telemetry keys with their cross-rank reduction.

use std::sync::Arc;

use serde::Serialize;

/// Every key starts with this.
pub const PREFIX: &str = "sampler/";

/// How a key is reduced across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Reduction {
    Min,
    Max,
    /// Summed; the reduced dict also carries `<key>_max` (worst rank).
    Sum,
    /// Fixed-edge bucket counts, summed; percentiles from the merged buckets.
    Histogram,
}

#[derive(Debug, Clone, Serialize)]
pub struct SchemaEntry {
    pub key: String,
    pub reduction: Reduction,
    /// Bucket upper bounds (last `+inf`) for histograms.
    pub edges: Option<Arc<[f64]>>,
    /// Unit / meaning, for dashboards and HELP text.
    pub help: &'static str,
}

/// The keys a sampler reports, in a fixed order.
#[derive(Debug, Clone, Serialize)]
pub struct TelemetrySchema {
    pub entries: Vec<SchemaEntry>,
    pub task_names: Vec<String>,
    /// The keys a drain produces, in order: scalar keys as they are,
    /// histograms expanded into `<key>/bucket_NN`, `<key>_p50`, `_p95`, `_max`.
    pub drained_keys: Vec<String>,
}

fn pow2_edges(upto: usize) -> Arc<[f64]> {
    let mut e = vec![];
    let mut x = 1usize;
    while x < upto {
        e.push(x as f64);
        x *= 2;
    }
    e.push(upto as f64);
    e.push(f64::INFINITY);
    e.into()
}

/// Stage latency bucket edges: 1 µs · 2^k up to ~16 s.
pub fn seconds_edges() -> Arc<[f64]> {
    let mut e: Vec<f64> = (0..25).map(|k| 1e-6 * (1u64 << k) as f64).collect();
    e.push(f64::INFINITY);
    e.into()
}

pub fn padding_edges() -> Arc<[f64]> {
    vec![
        0.0,
        0.05,
        0.1,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        0.95,
        1.0,
        f64::INFINITY,
    ]
    .into()
}

impl TelemetrySchema {
    /// The schema for a database with `task_names` sampled with `max_hops`
    /// hops and sequences of `seq_len` cells.
    pub fn new(task_names: &[String], max_hops: usize, seq_len: usize) -> Self {
        use Reduction::*;
        let mut entries = Vec::new();
        let mut add =
            |key: &str, reduction: Reduction, edges: Option<Arc<[f64]>>, help: &'static str| {
                entries.push(SchemaEntry {
                    key: format!("{PREFIX}{key}"),
                    reduction,
                    edges,
                    help,
                })
            };
        add(
            "pool/remaining_min",
            Min,
            None,
            "seeds left before reshuffle, least full active pool",
        );
        add(
            "pool/remaining_max",
            Max,
            None,
            "seeds left before reshuffle, fullest active pool",
        );
        add(
            "pool/remaining_fraction_min",
            Min,
            None,
            "remaining / pool size, least full active pool (ratio)",
        );
        add(
            "pool/remaining_fraction_max",
            Max,
            None,
            "remaining / pool size, fullest active pool (ratio)",
        );
        add(
            "pool/steps_since_pick_max",
            Max,
            None,
            "batches since the least recently picked weighted task was picked",
        );
        add(
            "pool/steps_to_exhaust_min",
            Min,
            None,
            "forecast batches until the first active pool runs out",
        );
        add(
            "pool/exhaust_events",
            Sum,
            None,
            "pools that ran out and reshuffled",
        );
        add(
            "mix/tv_distance",
            Max,
            None,
            "total-variation distance of the recent task mix from the configured weights (ratio)",
        );
        for t in task_names {
            add(&format!("tasks/{t}"), Sum, None, "seeds drawn for the task");
        }
        let depth: Arc<[f64]> = (0..=max_hops)
            .map(|h| h as f64)
            .chain([f64::INFINITY])
            .collect::<Vec<_>>()
            .into();
        add(
            "bfs/depth",
            Histogram,
            Some(depth),
            "BFS hops reached per sequence",
        );
        add(
            "bfs/rows",
            Histogram,
            Some(pow2_edges(seq_len)),
            "rows per sequence",
        );
        add(
            "padding/fraction",
            Histogram,
            Some(padding_edges()),
            "padded share of each sequence (ratio)",
        );
        add(
            "truncation/cells_dropped",
            Sum,
            None,
            "cells of reached rows cut by the sequence budget",
        );
        add(
            "bfs/children_capped",
            Sum,
            None,
            "visible children not sampled because of bfs_child_width",
        );
        add(
            "bfs/temporal_filtered",
            Sum,
            None,
            "children hidden by the observation-time filter",
        );
        add(
            "queue/depth_min",
            Min,
            None,
            "fewest batches waiting in the prefetch channel at a consumer call",
        );
        add(
            "queue/wait_seconds",
            Sum,
            None,
            "time the consumer blocked waiting for a batch (seconds)",
        );
        add(
            "stage/bfs_seconds",
            Histogram,
            Some(seconds_edges()),
            "BFS stage latency per batch (seconds)",
        );
        add(
            "stage/assemble_seconds",
            Histogram,
            Some(seconds_edges()),
            "assembly + permutations latency per batch (seconds)",
        );
        add(
            "stage/collate_seconds",
            Histogram,
            Some(seconds_edges()),
            "text dedup + gather latency per batch (seconds)",
        );
        add(
            "stage/total_seconds",
            Histogram,
            Some(seconds_edges()),
            "whole-batch production latency (seconds)",
        );
        add(
            "invariants/duplicate_seeds",
            Sum,
            None,
            "seeds drawn twice in one epoch on one rank (must stay 0)",
        );
        add(
            "invariants/temporal_leaks",
            Sum,
            None,
            "rows with time after the seed's observation time (must stay 0)",
        );
        add("batches", Sum, None, "batches delivered");
        add(
            "resumes",
            Sum,
            None,
            "restores of the sampler from a saved state (resume or reshard)",
        );
        let mut drained_keys = Vec::new();
        for e in &entries {
            match &e.edges {
                Some(edges) if e.reduction == Histogram => {
                    drained_keys
                        .extend((0..edges.len()).map(|i| format!("{}/bucket_{i:02}", e.key)));
                    drained_keys.extend(["p50", "p95", "max"].map(|q| format!("{}_{q}", e.key)));
                }
                _ => drained_keys.push(e.key.clone()),
            }
        }
        TelemetrySchema {
            entries,
            task_names: task_names.to_vec(),
            drained_keys,
        }
    }

    pub fn entry(&self, key: &str) -> Option<&SchemaEntry> {
        self.entries.iter().find(|e| e.key == key)
    }
}
