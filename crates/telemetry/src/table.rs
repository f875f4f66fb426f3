//! The metric table: one row per step metric, the only place a metric is
//! defined.
//!
//! A row says what the metric is called in the drain (`key`, under
//! [`PREFIX`](super::PREFIX)), how ranks reduce it, its bucket rule if it is
//! bucketed, whether it has one value per task, its Prometheus name, type,
//! unit and help text, and how its value is taken from the readings of a [`BatchReport`]
//! (`headwater_common::readings`, the measurement vocabulary).
//! The rows themselves are the data table `rows.rs` ([`METRICS`]). The drain
//! recorder, the packed layout, `telemetry_schema()`, the Prometheus exporter
//! and the Python reducer all walk it; adding a metric is one row there, a
//! field of the readings and the line that measures it.
//!
//! Row order is the drain order. Never reorder rows without bumping the
//! consumers (dashboards, W&B panels keyed by name are unaffected, packed
//! positions are).

use std::sync::Arc;

use serde::Serialize;

use super::hist::{latency_edges, QuantileRule};
use super::report::BatchReport;
use headwater_common::readings::{DatabaseDraw, SeqReadings};

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
    /// A ratio of two sums over the batches: the first function's total
    /// over the second's (the third field when the second sums to 0, as
    /// for a batch that probed nothing). A gauge is set to each batch's own
    /// ratio.
    Ratio(fn(&BatchReport) -> f64, fn(&BatchReport) -> f64, f64),
    /// Summed over every sequence of every batch.
    TotalSeq(fn(&BatchReport, &SeqReadings) -> f64),
    /// One histogram sample per batch.
    Sample(fn(&BatchReport) -> f64),
    /// One histogram sample per sequence.
    SampleSeq(fn(&BatchReport, &SeqReadings) -> f64),
    /// Seeds drawn, counted under the batch's task (per-task rows only).
    TaskSeeds,
    /// Seeds (contexts) of the batch of one task kind
    /// (`readings::TASK_KINDS`; per-kind rows, key `…/{kind}`).
    KindSeeds,
    /// Seeds drawn, counted under the batch's database (per-database rows).
    DatabaseSeeds,
    /// Exhaust events, counted under the batch's database (per-database).
    DatabaseExhausts,
    /// The reported database's own state after the batch's draw (a
    /// snapshot; per-database rows).
    DatabaseLast(fn(&DatabaseDraw) -> f64),
}

impl std::fmt::Debug for Measure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Measure::Last(_) => "Last",
            Measure::Least(_) => "Least",
            Measure::Total(_) => "Total",
            Measure::Ratio(..) => "Ratio",
            Measure::TotalSeq(_) => "TotalSeq",
            Measure::Sample(_) => "Sample",
            Measure::SampleSeq(_) => "SampleSeq",
            Measure::TaskSeeds => "TaskSeeds",
            Measure::KindSeeds => "KindSeeds",
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
            Measure::TotalSeq(f) | Measure::SampleSeq(f) => {
                r.batch.seqs.iter().map(|s| f(r, s)).sum()
            }
            Measure::Ratio(num, den, empty) => ratio(num(r), den(r), empty),
            Measure::TaskSeeds | Measure::DatabaseSeeds | Measure::KindSeeds => r.seeds(),
            Measure::DatabaseExhausts => f64::from(r.batch.exhaust_events),
            Measure::DatabaseLast(_) => 0.0,
        }
    }

    /// This batch's contribution to the series of the reported database
    /// `db` (mixture index) at `slot` (its place among the reported
    /// databases): `None` when the batch does not change that series.
    pub fn per_database(self, r: &BatchReport, db: usize, slot: usize) -> Option<f64> {
        match self {
            Measure::DatabaseSeeds if !r.batch.db_seeds.is_empty() => {
                let n = r.batch.db_seeds.iter().filter(|e| e.0 as usize == db);
                Some(n.map(|e| f64::from(e.1)).sum())
            }
            Measure::DatabaseSeeds => (r.db() == db).then_some(r.seeds()),
            Measure::DatabaseExhausts => {
                (r.db() == db).then_some(f64::from(r.batch.exhaust_events))
            }
            Measure::DatabaseLast(f) => r.batch.draw.databases.get(slot).map(f),
            other => Some(other.per_batch(r)),
        }
    }

    /// This batch's contribution to the series of task kind `kind`
    /// (`readings::TASK_KINDS` index; a [`Measure::KindSeeds`] row).
    pub fn per_kind(self, r: &BatchReport, kind: usize) -> f64 {
        r.batch.kind_seeds.get(kind).map_or(0.0, |&n| f64::from(n))
    }

    /// Call `each` with every histogram sample of the batch.
    pub fn samples(self, r: &BatchReport, mut each: impl FnMut(f64)) {
        match self {
            Measure::SampleSeq(f) | Measure::TotalSeq(f) => {
                r.batch.seqs.iter().for_each(|s| each(f(r, s)));
            }
            other => each(other.per_batch(r)),
        }
    }
}

/// `num / den`, or `empty` when `den` is 0 (what a [`Measure::Ratio`]
/// reads).
pub fn ratio(num: f64, den: f64, empty: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else {
        empty
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
    /// What `headwater diag` judges this metric by and the band a healthy
    /// run keeps it in (`None`: the metric is shown, not judged). The
    /// diagnostic signals, the dashboards' panel text and the metrics
    /// reference all read it from here.
    pub healthy: Option<Healthy>,
    /// How the value is taken from the batch reports.
    pub measure: Measure,
}

impl MetricDef {
    /// One value per task kind (key `…/{kind}`, Prometheus label `kind`,
    /// one series per `readings::TASK_KINDS` name).
    pub fn per_kind(&self) -> bool {
        matches!(self.measure, Measure::KindSeeds)
    }
}

/// A metric's health: a statistic of its values over a run's steps (how it
/// is computed is the diagnostic signal's rule, `headwater.diag.signals`)
/// and the band a healthy run keeps it in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Healthy {
    /// The statistic, in words.
    pub what: &'static str,
    /// Its unit (an axis label).
    pub unit: &'static str,
    /// Smallest healthy value.
    pub lo: f64,
    /// Largest healthy value (`None`: no upper bound).
    pub hi: Option<f64>,
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
pub static TRAINER_GAUGES: &[TrainerGauge] = &[
    TrainerGauge {
        key: "trainer/verdict",
        prometheus: "headwater_trainer_verdict",
        unit: "code",
        help: "the input verdict of the latest logged step: 0 ok, 1 input_bound, 2 input_straggler, 3 cpu_starved, 4 io_bound",
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
    TrainerGauge {
        key: "trainer/mfu",
        prometheus: "headwater_trainer_mfu_ratio",
        unit: "ratio",
        help: "model FLOPs utilisation of the latest log window: the model's FLOPs per step over the step time and the devices' peak FLOP/s (never set where the peak is unknown, as on a CPU)",
    },
];

#[cfg(test)]
mod tests {
    use super::super::rows::METRICS;
    use super::*;

    #[test]
    fn rows_are_consistent() {
        let mut keys = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for m in METRICS {
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
            assert_eq!(
                m.key.contains("{kind}"),
                matches!(m.measure, Measure::KindSeeds),
                "{}: a per-kind row is read by KindSeeds",
                m.key
            );
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
            if let Some(h) = m.healthy {
                assert!(
                    h.lo.is_finite() && h.hi.is_none_or(|hi| hi >= h.lo),
                    "{}",
                    m.key
                );
                assert!(!h.what.is_empty() && !h.unit.is_empty(), "{}", m.key);
            }
        }
        for g in TRAINER_GAUGES {
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
