//! Exporting telemetry out of the process: Prometheus (`prometheus.rs`) and
//! OTLP traces (`otel.rs`).
//!
//! Recording stays separate from exporting: the [`super::StepRecorder`]
//! feeds the drain API; the exporter keeps cumulative series for scrapers.

pub mod otel;
pub mod prometheus;
