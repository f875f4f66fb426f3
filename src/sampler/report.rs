//! Readings → telemetry: the one place that hands a delivered batch's
//! readings (`crate::readings`) to the split's recorders, with what the
//! consumer side measured when it handed the batch over.
//!
//! The pipeline imports `batch`, `readings` and `telemetry`; `telemetry`
//! reads the readings and never a `Batch`. Nothing is copied per batch: the
//! recorders read the producer's readings through a [`BatchReport`].

use crate::readings::{BatchReadings, DeliveryReadings};
use crate::telemetry::{BatchReport, Recorder, StepRecorder, TelemetrySchema};

/// One split's telemetry: the consumer side's readings, the drain recorder
/// and the exporters (every one a [`Recorder`]).
pub struct SplitTelemetry {
    delivery: DeliveryReadings,
    /// Resumes not yet reported with a batch.
    pending_resumes: f64,
    /// Accumulates for the drain API.
    pub drain: StepRecorder,
    /// Exporters fed the same reports (Prometheus, …).
    pub exporters: Vec<Box<dyn Recorder>>,
}

impl SplitTelemetry {
    /// A drain recorder for `schema` and the given exporters.
    pub fn new(schema: &TelemetrySchema, exporters: Vec<Box<dyn Recorder>>) -> Self {
        SplitTelemetry {
            delivery: DeliveryReadings::default(),
            pending_resumes: 0.0,
            drain: StepRecorder::new(schema),
            exporters,
        }
    }

    /// Report `seconds` as `sampler/startup_seconds` with every batch.
    pub fn set_startup_seconds(&mut self, seconds: f64) {
        self.delivery.startup_seconds = seconds;
    }

    /// The sampler was restored from a saved state: reported with the next
    /// delivered batch (`sampler/resumes`).
    pub fn note_resume(&mut self) {
        self.pending_resumes += 1.0;
    }

    /// Record one delivered batch's `readings` in the drain and every
    /// exporter: `depth` batches were waiting when the consumer asked and
    /// it blocked `wait_seconds`.
    #[allow(clippy::cast_precision_loss)]
    pub fn deliver(&mut self, readings: &BatchReadings, depth: usize, wait_seconds: f64) {
        self.delivery.queue_depth = depth as f64;
        self.delivery.wait_seconds = wait_seconds;
        self.delivery.resumes = std::mem::take(&mut self.pending_resumes);
        if readings.first_batch_ns > 0 {
            // The split's first batch: reported with every batch after it.
            self.delivery.first_batch_seconds = readings.first_batch_ns as f64 * 1e-9;
        }
        let report = BatchReport {
            batch: readings,
            delivery: self.delivery,
        };
        self.drain.record(&report);
        for e in &mut self.exporters {
            e.record(&report);
        }
    }
}
