//! Exporting telemetry out of the process: Prometheus (`prometheus.rs`) and
//! OTLP traces (`otel.rs`), each behind the crate feature of its name.
//!
//! Recording stays separate from exporting: the [`super::StepRecorder`]
//! feeds the drain API; the exporter keeps cumulative series for scrapers.
//! A build without a feature keeps the module's interface: asking it for an
//! endpoint is then a config error naming the feature (`otel_off.rs`, and
//! `prometheus::install`).

#[cfg(feature = "otlp")]
pub mod otel;
#[cfg(not(feature = "otlp"))]
#[path = "otel_off.rs"]
pub mod otel;
pub mod prometheus;

/// The OTLP endpoint to use: the explicit one, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub fn resolve_otlp_endpoint(explicit: Option<&str>) -> Option<String> {
    explicit
        .map(str::to_string)
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|s| !s.trim().is_empty())
}
