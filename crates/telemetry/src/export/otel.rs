//! Tracing spans per batch stage, exported over OTLP (HTTP/protobuf) when an
//! endpoint is configured (`otlp_endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! Off by default: with no endpoint no subscriber is installed, and a
//! `tracing` span is then a single check of the global dispatcher. Export
//! happens on the SDK's batch thread, never on the sampling path; the
//! provider is flushed when a sampler shuts down.
//!
//! Besides the stage spans, [`OtlpSplit`] (a [`Recorder`]) emits one
//! `delivered` span per delivered batch whose attributes are the metric
//! table's rows (`headwater.<key with / as .>`): per-batch values, and the
//! mean over sequences for per-sequence histograms. Attribute names come from
//! the table only.

use std::sync::{Mutex, OnceLock};

use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Key, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;

use crate::{BatchReport, Measure, MetricDef, Recorder, METRICS};
use headwater_common::error::{Error, Result};

static PROVIDER: OnceLock<Mutex<Option<(String, SdkTracerProvider)>>> = OnceLock::new();

pub use super::resolve_otlp_endpoint as resolve_endpoint;

/// Install the process-wide OTLP span exporter for `endpoint` (base URL;
/// spans go to `<endpoint>/v1/traces`). Idempotent for the same endpoint.
pub fn install(endpoint: &str, rank: u32) -> Result<()> {
    let slot = PROVIDER.get_or_init(|| Mutex::new(None));
    let mut g = slot.lock().unwrap();
    if let Some((existing, _)) = g.as_ref() {
        if existing == endpoint {
            return Ok(());
        }
        return Err(Error::Config {
            key: "otlp_endpoint".into(),
            value: None,
            what: format!("this process already exports spans to {existing}; one endpoint per process (asked for {endpoint})"),
        });
    }
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .build()
        .map_err(|e| Error::Config {
            key: "otlp_endpoint".into(),
            value: None,
            what: format!("cannot export spans to {url}: {e}"),
        })?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("headwater")
                .with_attribute(opentelemetry::KeyValue::new("headwater.rank", rank as i64))
                .build(),
        )
        .build();
    let tracer = provider.tracer("headwater");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber).map_err(|e| Error::Config {
        key: "otlp_endpoint".into(),
        value: None,
        what: format!("a global tracing subscriber is already installed: {e}"),
    })?;
    *g = Some((endpoint.to_string(), provider));
    Ok(())
}

/// Push buffered spans out now (blocks on network I/O).
pub fn flush() {
    if let Some(slot) = PROVIDER.get() {
        if let Some((_, p)) = slot.lock().unwrap().as_ref() {
            let _ = p.force_flush();
        }
    }
}

/// A tracer of the installed provider, if spans are exported.
fn tracer() -> Option<opentelemetry_sdk::trace::SdkTracer> {
    let slot = PROVIDER.get()?;
    let g = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    g.as_ref().map(|(_, p)| p.tracer("headwater"))
}

/// The OTLP exporter of one split: a `delivered` span per batch carrying
/// every (non-per-task) metric of the table as an attribute.
pub struct OtlpSplit {
    tracer: opentelemetry_sdk::trace::SdkTracer,
    split: &'static str,
    keys: Vec<(&'static MetricDef, Key)>,
}

impl OtlpSplit {
    /// The exporter for `split`, when [`install`] has run (else `None`).
    pub fn new(split: &'static str) -> Option<Self> {
        Some(OtlpSplit {
            tracer: tracer()?,
            split,
            keys: METRICS
                .iter()
                .filter(|d| !d.per_task && !d.per_database && !d.per_kind())
                .map(|d| {
                    (
                        d,
                        Key::from(format!("headwater.{}", d.key.replace('/', "."))),
                    )
                })
                .collect(),
        })
    }
}

#[allow(clippy::cast_precision_loss)]
fn span_value(m: Measure, r: &BatchReport) -> f64 {
    match m {
        Measure::SampleSeq(_) => m.per_batch(r) / r.batch.seqs.len().max(1) as f64,
        _ => m.per_batch(r),
    }
}

impl Recorder for OtlpSplit {
    fn record(&mut self, r: &BatchReport) {
        let mut span = self.tracer.start("delivered");
        span.set_attribute(KeyValue::new("split", self.split));
        span.set_attribute(KeyValue::new("task", i64::from(r.batch.task)));
        for (def, key) in &self.keys {
            span.set_attribute(KeyValue::new(key.clone(), span_value(def.measure, r)));
        }
        span.end();
    }
}
