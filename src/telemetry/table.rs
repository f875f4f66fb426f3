//! The metric table: one row per step metric, the only place a metric is
//! defined.
//!
//! A row says what the metric is called in the drain (`key`, under
//! [`PREFIX`](super::PREFIX)), how ranks reduce it, its bucket rule if it is
//! bucketed, whether it has one value per task, its Prometheus name, type,
//! unit and help text, and how its value is taken from a [`BatchReport`].
//! The drain recorder, the packed layout, `telemetry_schema()`, the
//! Prometheus exporter and the Python reducer all walk this table; adding a
//! metric is one row here plus the code that measures it into the report.
//!
//! Row order is the drain order. Never reorder rows without bumping the
//! consumers (dashboards, W&B panels keyed by name are unaffected, packed
//! positions are).

use std::sync::Arc;

use serde::Serialize;

use super::hist::{latency_edges, QuantileRule};
use super::report::{BatchReport, SeqReport};

/// How a key is reduced across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Reduction {
    /// The smallest value over ranks (`<key>_argmin_rank` names the rank).
    Min,
    /// The largest value over ranks (`<key>_argmax_rank`).
    Max,
    /// Summed; the reduced dict also carries `<key>_max` (worst rank).
    Sum,
    /// Fixed-edge bucket counts, summed; percentiles from the merged buckets.
    Histogram,
}

impl Reduction {
    /// The name in `telemetry_schema()` (`MIN`, `MAX`, `SUM`, `HISTOGRAM`).
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Min => "MIN",
            Reduction::Max => "MAX",
            Reduction::Sum => "SUM",
            Reduction::Histogram => "HISTOGRAM",
        }
    }
}

/// The Prometheus type a row is exported as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PromType {
    /// Set to the latest per-batch value.
    Gauge,
    /// Incremented by each batch's value (integer counts).
    Counter,
    /// Each sample recorded into the row's buckets.
    Histogram,
}

impl PromType {
    /// `gauge`, `counter` or `histogram`.
    pub fn name(self) -> &'static str {
        match self {
            PromType::Gauge => "gauge",
            PromType::Counter => "counter",
            PromType::Histogram => "histogram",
        }
    }
}

/// Where a bucketed metric's edges come from (all end with `+inf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketRule {
    /// `0, 1, …, max_hops`: one bucket per hop count.
    Hops,
    /// `1, 2, 4, …` below `S`, then `S`.
    Pow2UpToS,
    /// Padding-ratio edges `0, .05, .1, .2, …, .9, .95, 1`.
    PaddingRatio,
    /// The log-linear latency layout of [`latency_edges`] (read at bucket
    /// midpoints).
    Latency,
}

impl BucketRule {
    /// The edges for a config with `max_hops` hops and `S = seq_len`.
    pub fn edges(self, max_hops: usize, seq_len: usize) -> Arc<[f64]> {
        match self {
            BucketRule::Hops => (0..=max_hops)
                .map(|h| h as f64)
                .chain([f64::INFINITY])
                .collect::<Vec<_>>()
                .into(),
            BucketRule::Pow2UpToS => {
                let mut e = vec![];
                let mut x = 1usize;
                while x < seq_len {
                    e.push(x as f64);
                    x *= 2;
                }
                e.push(seq_len as f64);
                e.push(f64::INFINITY);
                e.into()
            }
            BucketRule::PaddingRatio => vec![
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
            .into(),
            BucketRule::Latency => latency_edges(),
        }
    }

    /// How quantiles are read from these buckets.
    pub fn quantile_rule(self) -> QuantileRule {
        match self {
            BucketRule::Latency => QuantileRule::Midpoint,
            _ => QuantileRule::UpperEdge,
        }
    }

    /// Stable name (`hops`, `pow2_up_to_s`, `padding_ratio`, `latency`).
    pub fn name(self) -> &'static str {
        match self {
            BucketRule::Hops => "hops",
            BucketRule::Pow2UpToS => "pow2_up_to_s",
            BucketRule::PaddingRatio => "padding_ratio",
            BucketRule::Latency => "latency",
        }
    }
}

/// How a row's value is taken from the batch reports since the last drain.
#[derive(Clone, Copy)]
pub enum Measure {
    /// The last batch's value (a snapshot).
    Last(fn(&BatchReport) -> f64),
    /// The smallest per-batch value.
    Least(fn(&BatchReport) -> f64),
    /// Summed over batches.
    Total(fn(&BatchReport) -> f64),
    /// Summed over every sequence of every batch.
    TotalSeq(fn(&SeqReport) -> f64),
    /// One histogram sample per batch.
    Sample(fn(&BatchReport) -> f64),
    /// One histogram sample per sequence.
    SampleSeq(fn(&SeqReport) -> f64),
    /// Seeds drawn, counted under the batch's task (per-task rows only).
    TaskSeeds,
    /// Seeds drawn, counted under the batch's database (per-database rows).
    DatabaseSeeds,
    /// Exhaust events, counted under the batch's database (per-database).
    DatabaseExhausts,
    /// The reported database's own state after the batch's draw (a
    /// snapshot; per-database rows).
    DatabaseLast(fn(&crate::seeds::DatabaseDraw) -> f64),
}

impl std::fmt::Debug for Measure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Measure::Last(_) => "Last",
            Measure::Least(_) => "Least",
            Measure::Total(_) => "Total",
            Measure::TotalSeq(_) => "TotalSeq",
            Measure::Sample(_) => "Sample",
            Measure::SampleSeq(_) => "SampleSeq",
            Measure::TaskSeeds => "TaskSeeds",
            Measure::DatabaseSeeds => "DatabaseSeeds",
            Measure::DatabaseExhausts => "DatabaseExhausts",
            Measure::DatabaseLast(_) => "DatabaseLast",
        })
    }
}

impl Measure {
    /// This batch's contribution: the value a gauge is set to or a counter
    /// incremented by (sequence measures summed over the batch).
    pub fn per_batch(self, r: &BatchReport) -> f64 {
        match self {
            Measure::Last(f) | Measure::Least(f) | Measure::Total(f) | Measure::Sample(f) => f(r),
            Measure::TotalSeq(f) | Measure::SampleSeq(f) => r.seqs.iter().map(f).sum(),
            Measure::TaskSeeds | Measure::DatabaseSeeds => r.seeds,
            Measure::DatabaseExhausts => r.exhaust_events,
            Measure::DatabaseLast(_) => 0.0,
        }
    }

    /// This batch's contribution to the series of the reported database
    /// `db` (mixture index) at `slot` (its place among the reported
    /// databases): `None` when the batch does not change that series.
    pub fn per_database(self, r: &BatchReport, db: usize, slot: usize) -> Option<f64> {
        match self {
            Measure::DatabaseSeeds => (r.db == db).then_some(r.seeds),
            Measure::DatabaseExhausts => (r.db == db).then_some(r.exhaust_events),
            Measure::DatabaseLast(f) => r.draw.databases.get(slot).map(f),
            other => Some(other.per_batch(r)),
        }
    }

    /// Call `each` with every histogram sample of the batch.
    pub fn samples(self, r: &BatchReport, mut each: impl FnMut(f64)) {
        match self {
            Measure::SampleSeq(f) | Measure::TotalSeq(f) => r.seqs.iter().for_each(|s| each(f(s))),
            other => each(other.per_batch(r)),
        }
    }
}

/// One step metric.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Drain key without the prefix; per-task rows use `tasks/{task}`.
    pub key: &'static str,
    /// Cross-rank reduction of the drained value.
    pub reduction: Reduction,
    /// Bucket layout (histogram reductions, and Prometheus histograms).
    pub buckets: Option<BucketRule>,
    /// One value per task (key `tasks/<task>`, Prometheus label `task`).
    pub per_task: bool,
    /// One value per reported database of a mixture (key
    /// `databases/<database>/…`, Prometheus label `database`); none for a
    /// single database.
    pub per_database: bool,
    /// Exact Prometheus metric name.
    pub prometheus: &'static str,
    /// Prometheus type.
    pub prometheus_type: PromType,
    /// Unit of the value (`seeds`, `ratio`, `batches`, `seconds`, …).
    pub unit: &'static str,
    /// One-line meaning (drain schema help and Prometheus HELP).
    pub help: &'static str,
    /// How the value is taken from the batch reports.
    pub measure: Measure,
}

#[allow(clippy::too_many_arguments)]
const fn row(
    key: &'static str,
    reduction: Reduction,
    buckets: Option<BucketRule>,
    prometheus: &'static str,
    prometheus_type: PromType,
    unit: &'static str,
    help: &'static str,
    measure: Measure,
) -> MetricDef {
    MetricDef {
        key,
        reduction,
        buckets,
        per_task: false,
        per_database: false,
        prometheus,
        prometheus_type,
        unit,
        help,
        measure,
    }
}

use BucketRule as B;
use PromType::{Counter, Gauge, Histogram as PHist};
use Reduction::{Histogram as Hist, Max, Min, Sum};

/// Every step metric, in drain order.
pub static METRICS: [MetricDef; 38] = [
    row(
        "pool/remaining_min",
        Min,
        None,
        "headwater_pool_remaining_min_seeds",
        Gauge,
        "seeds",
        "seeds left before reshuffle, least full active pool",
        Measure::Last(|r| r.draw.remaining_min),
    ),
    row(
        "pool/remaining_max",
        Max,
        None,
        "headwater_pool_remaining_max_seeds",
        Gauge,
        "seeds",
        "seeds left before reshuffle, fullest active pool",
        Measure::Last(|r| r.draw.remaining_max),
    ),
    row(
        "pool/remaining_fraction_min",
        Min,
        None,
        "headwater_pool_remaining_fraction_min_ratio",
        Gauge,
        "ratio",
        "remaining / pool size, least full active pool (ratio)",
        Measure::Last(|r| r.draw.remaining_fraction_min),
    ),
    row(
        "pool/remaining_fraction_max",
        Max,
        None,
        "headwater_pool_remaining_fraction_max_ratio",
        Gauge,
        "ratio",
        "remaining / pool size, fullest active pool (ratio)",
        Measure::Last(|r| r.draw.remaining_fraction_max),
    ),
    row(
        "pool/steps_since_pick_max",
        Max,
        None,
        "headwater_pool_steps_since_pick_max_batches",
        Gauge,
        "batches",
        "batches since the least recently picked weighted task was picked",
        Measure::Last(|r| r.draw.steps_since_pick_max),
    ),
    row(
        "pool/steps_to_exhaust_min",
        Min,
        None,
        "headwater_pool_steps_to_exhaust_min_batches",
        Gauge,
        "batches",
        "forecast batches until the first active pool runs out",
        Measure::Last(|r| r.draw.steps_to_exhaust_min),
    ),
    row(
        "pool/exhaust_events",
        Sum,
        None,
        "headwater_pool_exhaust_events_total",
        Counter,
        "events",
        "pools that ran out and reshuffled",
        Measure::Total(|r| r.exhaust_events),
    ),
    row(
        "mix/tv_distance",
        Max,
        None,
        "headwater_mix_tv_distance_ratio",
        Gauge,
        "ratio",
        "total-variation distance of the recent task mix from the configured weights (ratio)",
        Measure::Last(|r| r.draw.tv_distance),
    ),
    MetricDef {
        key: "tasks/{task}",
        reduction: Sum,
        buckets: None,
        per_task: true,
        per_database: false,
        prometheus: "headwater_task_seeds_drawn_total",
        prometheus_type: Counter,
        unit: "seeds",
        help: "seeds drawn for the task",
        measure: Measure::TaskSeeds,
    },
    row(
        "bfs/depth",
        Hist,
        Some(B::Hops),
        "headwater_bfs_depth_hops",
        PHist,
        "hops",
        "BFS hops reached per sequence",
        Measure::SampleSeq(|s| s.depth),
    ),
    row(
        "bfs/rows",
        Hist,
        Some(B::Pow2UpToS),
        "headwater_bfs_sequence_rows",
        PHist,
        "rows",
        "rows per sequence",
        Measure::SampleSeq(|s| s.rows),
    ),
    row(
        "padding/fraction",
        Hist,
        Some(B::PaddingRatio),
        "headwater_padding_fraction_ratio",
        PHist,
        "ratio",
        "padded share of each sequence (ratio)",
        Measure::SampleSeq(|s| s.padding),
    ),
    row(
        "packing/segments_per_sequence",
        Hist,
        Some(B::Pow2UpToS),
        "headwater_packing_segments_per_sequence",
        PHist,
        "segments",
        "seeds' contexts (segments) per sequence: 1 without pack; with it 1 to 2 x the task's seeds per sequence on average (pack_factor, or measured per task with pack_factor = 0)",
        Measure::SampleSeq(|s| s.segments),
    ),
    row(
        "packing/contexts_cut",
        Sum,
        None,
        "headwater_packing_contexts_cut_total",
        Counter,
        "contexts",
        "contexts cut to the prefix of their rows that fits a packing budget below S",
        Measure::TotalSeq(|s| s.contexts_cut),
    ),
    row(
        "truncation/cells_dropped",
        Sum,
        None,
        "headwater_truncation_cells_dropped_total",
        Counter,
        "cells",
        "cells of reached rows cut by the sequence budget",
        Measure::TotalSeq(|s| s.cells_dropped),
    ),
    row(
        "bfs/children_capped",
        Sum,
        None,
        "headwater_bfs_children_capped_total",
        Counter,
        "rows",
        "visible children not sampled because of bfs_child_width",
        Measure::TotalSeq(|s| s.children_capped),
    ),
    row(
        "bfs/temporal_filtered",
        Sum,
        None,
        "headwater_bfs_temporal_filtered_total",
        Counter,
        "rows",
        "children hidden by the observation-time filter",
        Measure::TotalSeq(|s| s.temporal_filtered),
    ),
    row(
        "queue/depth_min",
        Min,
        None,
        "headwater_queue_depth_batches",
        Gauge,
        "batches",
        "fewest batches waiting in the prefetch channel at a consumer call",
        Measure::Least(|r| r.queue_depth),
    ),
    // Drained as a sum per step; exported as a latency histogram per call.
    row(
        "queue/wait_seconds",
        Sum,
        Some(B::Latency),
        "headwater_queue_wait_seconds",
        PHist,
        "seconds",
        "time the consumer blocked waiting for a batch (seconds)",
        Measure::Total(|r| r.wait_seconds),
    ),
    row(
        "stage/bfs_seconds",
        Hist,
        Some(B::Latency),
        "headwater_stage_bfs_seconds",
        PHist,
        "seconds",
        "BFS stage latency per batch (seconds)",
        Measure::Sample(|r| r.stage_seconds[0]),
    ),
    row(
        "stage/assemble_seconds",
        Hist,
        Some(B::Latency),
        "headwater_stage_assemble_seconds",
        PHist,
        "seconds",
        "assembly + permutations latency per batch (seconds)",
        Measure::Sample(|r| r.stage_seconds[1]),
    ),
    row(
        "stage/collate_seconds",
        Hist,
        Some(B::Latency),
        "headwater_stage_collate_seconds",
        PHist,
        "seconds",
        "text dedup + gather latency per batch (seconds)",
        Measure::Sample(|r| r.stage_seconds[2]),
    ),
    row(
        "stage/total_seconds",
        Hist,
        Some(B::Latency),
        "headwater_stage_total_seconds",
        PHist,
        "seconds",
        "whole-batch production latency (seconds)",
        Measure::Sample(|r| r.stage_seconds[3]),
    ),
    row(
        "invariants/duplicate_seeds",
        Sum,
        None,
        "headwater_invariant_duplicate_seeds_total",
        Counter,
        "seeds",
        "seeds drawn twice in one epoch on one rank (must stay 0)",
        Measure::Total(|r| r.duplicate_seeds),
    ),
    row(
        "invariants/temporal_leaks",
        Sum,
        None,
        "headwater_invariant_temporal_leaks_total",
        Counter,
        "rows",
        "rows with time after the seed's observation time (must stay 0)",
        Measure::TotalSeq(|s| s.temporal_leaks),
    ),
    row(
        "batches",
        Sum,
        None,
        "headwater_batches_delivered_total",
        Counter,
        "batches",
        "batches delivered",
        Measure::Total(|_| 1.0),
    ),
    row(
        "resumes",
        Sum,
        None,
        "headwater_sampler_resumes_total",
        Counter,
        "resumes",
        "restores of the sampler from a saved state (resume or reshard)",
        Measure::Total(|r| r.resumes),
    ),
    row(
        "startup_seconds",
        Max,
        None,
        "headwater_sampler_startup_seconds",
        Gauge,
        "seconds",
        "time to open the database, prepare the sampler and build the seed pools (slowest rank)",
        Measure::Last(|r| r.startup_seconds),
    ),
    row(
        "mix/database_tv_distance",
        Max,
        None,
        "headwater_mix_database_tv_distance_ratio",
        Gauge,
        "ratio",
        "total-variation distance of the recent database mix from the database shares (ratio; 0 for one database)",
        Measure::Last(|r| r.draw.database_tv_distance),
    ),
    row(
        "databases/steps_since_pick_max",
        Max,
        None,
        "headwater_mixture_steps_since_pick_max_batches",
        Gauge,
        "batches",
        "batches since the least recently picked database with share > 0 was picked",
        Measure::Last(|r| r.draw.database_steps_since_pick_max),
    ),
    row(
        "databases/steps_since_pick_worst",
        Max,
        None,
        "headwater_mixture_steps_since_pick_worst_index",
        Gauge,
        "index",
        "mixture index of that database (a pointer: the same on every rank; its name is database_metadata()['databases'][i]['name'])",
        Measure::Last(|r| r.draw.database_steps_since_pick_worst),
    ),
    row(
        "databases/remaining_fraction_min",
        Min,
        None,
        "headwater_mixture_remaining_fraction_min_ratio",
        Gauge,
        "ratio",
        "remaining / pool size of the least full active pool of any database with share > 0 (ratio)",
        Measure::Last(|r| r.draw.database_remaining_fraction_min),
    ),
    row(
        "databases/remaining_fraction_worst",
        Max,
        None,
        "headwater_mixture_remaining_fraction_worst_index",
        Gauge,
        "index",
        "mixture index of that database (a pointer: the same on every rank)",
        Measure::Last(|r| r.draw.database_remaining_fraction_worst),
    ),
    row(
        "databases/other_seeds",
        Sum,
        None,
        "headwater_mixture_other_seeds_drawn_total",
        Counter,
        "seeds",
        "seeds drawn from databases without their own series (not in telemetry_databases, or outside telemetry_top_databases)",
        Measure::Total(|r| if r.draw.database_reported { 0.0 } else { r.seeds }),
    ),
    db_row(
        "databases/{database}/seeds",
        Sum,
        "headwater_database_seeds_drawn_total",
        Counter,
        "seeds",
        "seeds drawn from the database (reported databases of a mixture)",
        Measure::DatabaseSeeds,
    ),
    db_row(
        "databases/{database}/exhaust_events",
        Sum,
        "headwater_database_exhaust_events_total",
        Counter,
        "events",
        "pools of the database that ran out and reshuffled",
        Measure::DatabaseExhausts,
    ),
    db_row(
        "databases/{database}/steps_since_pick",
        Max,
        "headwater_database_steps_since_pick_batches",
        Gauge,
        "batches",
        "batches since the database was last picked",
        Measure::DatabaseLast(|d| d.steps_since_pick),
    ),
    db_row(
        "databases/{database}/remaining_fraction_min",
        Min,
        "headwater_database_remaining_fraction_min_ratio",
        Gauge,
        "ratio",
        "remaining / pool size of the database's least full active pool (ratio)",
        Measure::DatabaseLast(|d| d.remaining_fraction_min),
    ),
];

/// A per-database row (see [`MetricDef::per_database`]).
const fn db_row(
    key: &'static str,
    reduction: Reduction,
    prometheus: &'static str,
    prometheus_type: PromType,
    unit: &'static str,
    help: &'static str,
    measure: Measure,
) -> MetricDef {
    MetricDef {
        key,
        reduction,
        buckets: None,
        per_task: false,
        per_database: true,
        prometheus,
        prometheus_type,
        unit,
        help,
        measure,
    }
}

/// A value the trainer computes from the reduced step and the sampler's
/// Prometheus exporter serves (`Sampler.export_trainer`): a gauge labelled
/// with `rank` only. The W&B key is `key`; the trainer's code for it lives
/// in `headwater.train.verdict`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TrainerGauge {
    /// The trainer's key (`trainer/verdict`), as logged to W&B.
    pub key: &'static str,
    /// Prometheus name.
    pub prometheus: &'static str,
    /// Base unit (`ratio`, `rank`, `code`).
    pub unit: &'static str,
    /// Help text.
    pub help: &'static str,
}

/// Every trainer gauge: the only definition of their exported names.
pub const TRAINER_GAUGES: [TrainerGauge; 4] = [
    TrainerGauge {
        key: "trainer/verdict",
        prometheus: "headwater_trainer_verdict",
        unit: "code",
        help: "the input verdict of the latest logged step: 0 ok, 1 input_bound, 2 input_straggler",
    },
    TrainerGauge {
        key: "trainer/verdict_rank",
        prometheus: "headwater_trainer_verdict_rank",
        unit: "rank",
        help: "the rank an input_straggler verdict names (-1 when the verdict names none)",
    },
    TrainerGauge {
        key: "trainer/data_wait_share",
        prometheus: "headwater_trainer_data_wait_ratio",
        unit: "ratio",
        help: "share of the step time the trainer waited for the sampler (latest log window)",
    },
    TrainerGauge {
        key: "trainer/headspace_ratio",
        prometheus: "headwater_trainer_headspace_ratio",
        unit: "ratio",
        help: "batches/s the sampler makes over the batches/s the step needs for zero wait",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_consistent() {
        let mut keys = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for m in &METRICS {
            assert!(keys.insert(m.key), "duplicate key {}", m.key);
            assert!(
                names.insert(m.prometheus),
                "duplicate name {}",
                m.prometheus
            );
            assert!(m.prometheus.starts_with("headwater_"), "{}", m.prometheus);
            assert_eq!(
                m.prometheus.ends_with("_total"),
                m.prometheus_type == PromType::Counter,
                "{}: counters and only counters end in _total",
                m.prometheus
            );
            assert_eq!(
                m.reduction == Reduction::Histogram || m.prometheus_type == PromType::Histogram,
                m.buckets.is_some(),
                "{}: bucketed iff a histogram somewhere",
                m.key
            );
            assert_eq!(
                m.per_task,
                matches!(m.measure, Measure::TaskSeeds),
                "{}",
                m.key
            );
            assert_eq!(m.per_task, m.key.contains("{task}"), "{}", m.key);
            assert_eq!(m.per_database, m.key.contains("{database}"), "{}", m.key);
            assert_eq!(
                m.per_database,
                matches!(
                    m.measure,
                    Measure::DatabaseSeeds | Measure::DatabaseExhausts | Measure::DatabaseLast(_)
                ),
                "{}",
                m.key
            );
        }
        for g in &TRAINER_GAUGES {
            assert!(
                names.insert(g.prometheus),
                "duplicate name {}",
                g.prometheus
            );
            assert!(
                g.prometheus.starts_with("headwater_trainer_"),
                "{}",
                g.prometheus
            );
            assert!(g.key.starts_with("trainer/"), "{}", g.key);
        }
    }
}
