//! The telemetry schema of one sampler: the metric table expanded for its
//! reported tasks and databases, `max_hops` and `S`, with the drained key
//! order.
//!
//! Depends only on the snapshot metadata and the config, so every rank packs
//! identical shapes.
//!
//! Bounded for mixtures: a single database reports every task and no
//! per-database rows; a mixture reports per-task rows only for the tasks of
//! its K reported databases (the `telemetry_databases` list when set,
//! else `telemetry_top_databases`, the K largest shares) and per-database
//! rows only for those K. Per-kind rows have one value per task kind
//! (`readings::TASK_KINDS`), whatever kinds the tasks have. With `N` the
//! fixed rows' values (the per-kind rows' included), `T_K` the reported
//! tasks and `P` the per-database rows (4), the drain has `N + T_K + P·K`
//! values whatever the number of databases.

use std::sync::Arc;

use serde::Serialize;

use super::hist::QuantileRule;
use super::rows::METRICS;
use super::table::{MetricDef, Reduction};
use headwater_common::readings::TASK_KINDS;

/// Every key starts with this.
pub const PREFIX: &str = "sampler/";

/// One drained metric (a per-task row gives one entry per task).
#[derive(Debug, Clone, Serialize)]
pub struct SchemaEntry {
    /// Full key, with [`PREFIX`].
    pub key: String,
    /// Cross-rank reduction.
    pub reduction: Reduction,
    /// Bucket upper bounds (last `+inf`) for histogram reductions.
    pub edges: Option<Arc<[f64]>>,
    /// How p50/p95 are read from the buckets (histograms only).
    pub quantile: Option<QuantileRule>,
    /// Unit / meaning, for dashboards and HELP text.
    pub help: &'static str,
    /// The table row it comes from.
    #[serde(skip)]
    pub def: &'static MetricDef,
    /// Index of the task (mixture order) for per-task rows.
    #[serde(skip)]
    pub task: Option<usize>,
    /// (mixture index, reported slot) of the database for per-database rows.
    #[serde(skip)]
    pub database: Option<(usize, usize)>,
    /// Index of the task kind (`readings::TASK_KINDS`) for per-kind rows.
    #[serde(skip)]
    pub kind: Option<usize>,
}

/// The keys a sampler reports, in a fixed order.
#[derive(Debug, Clone, Serialize)]
pub struct TelemetrySchema {
    /// One entry per drained metric, in table order.
    pub entries: Vec<SchemaEntry>,
    /// The reported tasks' names (mixture order).
    pub task_names: Vec<String>,
    /// The reported tasks' mixture indices.
    pub task_ids: Vec<usize>,
    /// The reported databases' names (the `telemetry_databases` order,
    /// else largest share first).
    pub database_names: Vec<String>,
    /// The reported databases' mixture indices.
    pub database_ids: Vec<usize>,
    /// The keys a drain produces, in order: scalar keys as they are,
    /// histograms expanded into `<key>/bucket_NN`, `<key>_p50`, `_p95`, `_max`.
    pub drained_keys: Vec<String>,
    /// `max_hops` the bucket rules were expanded with.
    pub max_hops: usize,
    /// `S` the bucket rules were expanded with.
    pub seq_len: usize,
}

impl TelemetrySchema {
    /// The schema for a database with `task_names` sampled with `max_hops`
    /// hops and sequences of `seq_len` cells.
    pub fn new(task_names: &[String], max_hops: usize, seq_len: usize) -> Self {
        let tasks: Vec<(usize, String)> = task_names.iter().cloned().enumerate().collect();
        Self::for_mixture(&tasks, &[], max_hops, seq_len)
    }

    /// The schema reporting `tasks` and `databases` ((mixture index, name)
    /// pairs) per task and per database.
    pub fn for_mixture(
        tasks: &[(usize, String)],
        databases: &[(usize, String)],
        max_hops: usize,
        seq_len: usize,
    ) -> Self {
        let mut entries = Vec::new();
        for def in METRICS {
            let (edges, quantile) = match (def.reduction, def.buckets) {
                (Reduction::Histogram, Some(rule)) => (
                    Some(rule.edges(max_hops, seq_len)),
                    Some(rule.quantile_rule()),
                ),
                _ => (None, None),
            };
            let mut push = |key: String, task, database, kind| {
                entries.push(SchemaEntry {
                    key: format!("{PREFIX}{key}"),
                    reduction: def.reduction,
                    edges: edges.clone(),
                    quantile,
                    help: def.help,
                    def,
                    task,
                    database,
                    kind,
                });
            };
            if def.per_task {
                for (i, t) in tasks {
                    push(def.key.replace("{task}", t), Some(*i), None, None);
                }
            } else if def.per_database {
                for (slot, (d, name)) in databases.iter().enumerate() {
                    push(
                        def.key.replace("{database}", name),
                        None,
                        Some((*d, slot)),
                        None,
                    );
                }
            } else if def.per_kind() {
                // Every kind, present or not: the layout depends on the
                // table alone.
                for (i, name) in TASK_KINDS.iter().enumerate() {
                    push(def.key.replace("{kind}", name), None, None, Some(i));
                }
            } else {
                push(def.key.to_string(), None, None, None);
            }
        }
        let mut drained_keys = Vec::new();
        for e in &entries {
            match &e.edges {
                Some(edges) => {
                    drained_keys
                        .extend((0..edges.len()).map(|i| format!("{}/bucket_{i:02}", e.key)));
                    drained_keys.extend(["p50", "p95", "max"].map(|q| format!("{}_{q}", e.key)));
                }
                None => drained_keys.push(e.key.clone()),
            }
        }
        TelemetrySchema {
            entries,
            task_names: tasks.iter().map(|t| t.1.clone()).collect(),
            task_ids: tasks.iter().map(|t| t.0).collect(),
            database_names: databases.iter().map(|d| d.1.clone()).collect(),
            database_ids: databases.iter().map(|d| d.0).collect(),
            drained_keys,
            max_hops,
            seq_len,
        }
    }

    /// The entry of a full key.
    pub fn entry(&self, key: &str) -> Option<&SchemaEntry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// Bucket edges of a table row for this schema's config (`None` if the
    /// row is not bucketed).
    pub fn edges_of(&self, def: &MetricDef) -> Option<Arc<[f64]>> {
        def.buckets.map(|b| b.edges(self.max_hops, self.seq_len))
    }
}
