//! Step telemetry: what the sampler did, per delivered batch, per split.
//!
//! Every metric is one row of the metric table ([`METRICS`], `rows.rs`; the row type is `table.rs`):
//! key, reduction, bucket rule, Prometheus name/type/unit/help and how its
//! value is taken from the readings (`headwater_common::readings`, the measurement
//! vocabulary) a [`BatchReport`] points to. The pipeline hands one report per
//! delivered batch (queued batches do not count) and hands it to the split's
//! recorders: the drain recorder ([`StepRecorder`]) and the exporters
//! (`export/`), all implementations of [`Recorder`] held in one list. None
//! of them re-derives a value: they read the table's measures.
//! [`StepRecorder::drain`] returns a flat `key → f64` map in
//! [`TelemetrySchema`] order and clears the accumulators. Recording must stay
//! far below a step (< 5 µs per batch): no allocation, no locks other than
//! the split's own uncontended mutex.
//!
//! Never: names built from row/seed/step values (series count grows with
//! tasks only), blocking the producer, or importing `batch` (the readings are
//! the only input).

pub mod export;
mod hist;
mod report;
mod rows;
mod schema;
mod step;
mod table;

pub use hist::{
    latency_edges, quantile_from_buckets, FixedHistogram, QuantileRule, LATENCY_MIN_EXP,
    LATENCY_OCTAVES, LATENCY_SUB_BUCKETS,
};
pub use report::BatchReport;
pub use rows::METRICS;
pub use schema::{SchemaEntry, TelemetrySchema, PREFIX};
pub use step::StepRecorder;
pub use table::{
    ratio, BucketRule, Healthy, Measure, MetricDef, PromType, Reduction, TrainerGauge,
    TRAINER_GAUGES,
};

/// Something that consumes every delivered batch's report: the drain
/// recorder and each exporter (the metrics-rs recorder/exporter split).
pub trait Recorder: Send {
    /// Take one delivered batch into account.
    fn record(&mut self, report: &BatchReport);
}
