//! Step telemetry: what the sampler did, per delivered batch, per split.
//!
//! Every metric key is defined here, once ([`TelemetrySchema`]); the schema
//! depends only on the snapshot metadata and the config, so every rank packs
//! identical shapes. Recording happens when a batch is delivered to the
//! consumer (queued batches do not count): snapshot scalars (last batch),
//! counters and fixed-edge histograms accumulated since the last drain.
//! [`StepRecorder::drain`] returns them as a flat `key → f64` map and clears
//! the accumulators. Recording must stay far below a step (< 5 µs per batch):
//! no allocation, no locks other than the split's own uncontended mutex.
//!
//! Never: names built from row/seed/step values (series count grows with
//! tasks only), or blocking the producer.

pub mod export;
mod hist;
mod schema;
mod step;

pub use hist::{quantile_from_buckets, FixedHistogram};
pub use schema::{
    seconds_edges as schema_seconds_edges, Reduction, SchemaEntry, TelemetrySchema, PREFIX,
};
pub use step::{BatchTelemetry, MixWindow, StepRecorder};
