//! Batch → telemetry: the one place that reads a delivered [`Batch`] into a
//! [`BatchReport`] and hands it to the split's recorders.
//!
//! The pipeline imports both `batch` and `telemetry`, so neither imports the
//! other. The report buffer is reused across batches (no allocation after
//! the first batch).

use crate::batch::Batch;
use crate::telemetry::{BatchReport, Recorder, SeqReport, StepRecorder, TelemetrySchema};

/// Refill `r` from a delivered batch: `depth` batches were waiting when the
/// consumer asked and it blocked `wait_seconds`.
#[allow(clippy::cast_precision_loss)]
pub fn fill_report(r: &mut BatchReport, b: &Batch, depth: usize, wait_seconds: f64) {
    r.task = b.task_idx as usize;
    r.db = b.db_idx as usize;
    r.seeds = b.seeds.len() as f64;
    r.draw.clone_from(&b.draw);
    r.exhaust_events = f64::from(b.exhaust_events);
    r.duplicate_seeds = f64::from(b.duplicate_seeds);
    r.stage_seconds = b.stage_ns.map(|ns| ns as f64 * 1e-9);
    r.queue_depth = depth as f64;
    r.wait_seconds = wait_seconds;
    let s = b.seq_len as f64;
    r.seqs.clear();
    r.seqs.extend(b.seq_stats.iter().map(|q| SeqReport {
        depth: f64::from(q.depth),
        rows: f64::from(q.rows),
        padding: 1.0 - f64::from(q.cells) / s,
        cells_dropped: q.cells_dropped as f64,
        children_capped: q.children_capped as f64,
        temporal_filtered: q.temporal_filtered as f64,
        temporal_leaks: q.temporal_leaks as f64,
        segments: f64::from(q.segments),
        contexts_cut: f64::from(q.contexts_cut),
    }));
}

/// One split's telemetry: the reused report, the drain recorder and the
/// exporters (every one a [`Recorder`]).
pub struct SplitTelemetry {
    report: BatchReport,
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
            report: BatchReport::default(),
            pending_resumes: 0.0,
            drain: StepRecorder::new(schema),
            exporters,
        }
    }

    /// Report `seconds` as `sampler/startup_seconds` with every batch.
    pub fn set_startup_seconds(&mut self, seconds: f64) {
        self.report.startup_seconds = seconds;
    }

    /// The sampler was restored from a saved state: reported with the next
    /// delivered batch (`sampler/resumes`).
    pub fn note_resume(&mut self) {
        self.pending_resumes += 1.0;
    }

    /// Record one delivered batch in the drain and every exporter.
    pub fn deliver(&mut self, b: &Batch, depth: usize, wait_seconds: f64) {
        fill_report(&mut self.report, b, depth, wait_seconds);
        self.report.resumes = std::mem::take(&mut self.pending_resumes);
        self.drain.record(&self.report);
        for e in &mut self.exporters {
            e.record(&self.report);
        }
    }
}
