//! The OTLP exporter of a build without the `otlp` feature: the same
//! interface, no dependency on the OpenTelemetry SDK. Asking for an endpoint
//! is a config error naming the feature; no split exporter can exist.

use headwater_common::error::{Error, Result};

use crate::{BatchReport, Recorder};

pub use super::resolve_otlp_endpoint as resolve_endpoint;

/// Refuses: this build exports no spans.
pub fn install(endpoint: &str, _rank: u32) -> Result<()> {
    Err(Error::Config {
        key: "otlp_endpoint".into(),
        value: Some(endpoint.to_string()),
        what: "this build of headwater has no OTLP exporter: build headwater-telemetry \
               with its `otlp` feature (the Python wheel has it)"
            .into(),
    })
}

/// Nothing to flush.
pub fn flush() {}

/// No value of this type exists: without the feature there is no split
/// exporter to make.
pub enum OtlpSplit {}

impl OtlpSplit {
    /// Always `None` (nothing was installed).
    pub fn new(_split: &'static str) -> Option<Self> {
        None
    }
}

impl Recorder for OtlpSplit {
    fn record(&mut self, _report: &BatchReport) {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn asking_for_an_endpoint_names_the_missing_feature() {
        let e = super::install("http://127.0.0.1:4318", 0).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("otlp_endpoint") && text.contains("`otlp` feature"),
            "{text}"
        );
        assert!(super::OtlpSplit::new("train").is_none());
    }
}
