//! What a [`Sampler`] reports: the batches it hands over, recorded in their
//! split's telemetry, and the drained step metrics and trainer gauges the
//! trainer reads or serves. The recorders themselves are `report.rs`.

use super::{telemetry_index, MadeBatch, Sampler};
use crate::error::Result;
use crate::seeds::Split;
use crate::telemetry::export::prometheus;

impl Sampler {
    /// Record a batch handed to the consumer: `depth` batches were waiting
    /// when it asked and it blocked `wait_seconds`.
    pub(super) fn record(&self, split: Split, b: &MadeBatch, depth: usize, wait_seconds: f64) {
        if !self.core.cfg.telemetry {
            return;
        }
        self.telemetry[telemetry_index(split)]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .deliver(&b.readings, depth, wait_seconds);
    }

    /// The step metrics of `split` since the last drain, one value per
    /// `schema.drained_keys` (empty if no batch was delivered since),
    /// clearing the accumulated counters.
    pub fn drain_step_values(&self, split: Split) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        self.telemetry[telemetry_index(split)]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain
            .drain_values(&self.core.schema, &mut out);
        Ok(out)
    }

    /// [`drain_step_values`](Self::drain_step_values) paired with the keys.
    pub fn drain_step_metrics(&self, split: Split) -> Result<Vec<(String, f64)>> {
        let v = self.drain_step_values(split)?;
        Ok(self
            .core
            .schema
            .drained_keys
            .iter()
            .cloned()
            .zip(v)
            .collect())
    }

    /// Serve the trainer's gauges (`(key, value)` pairs of
    /// [`TRAINER_GAUGES`](crate::telemetry::TRAINER_GAUGES)) on this
    /// process's `/metrics`, labelled with this sampler's rank.
    pub fn export_trainer(&self, values: &[(String, f64)]) -> Result<()> {
        prometheus::set_trainer_gauges(self.core.cfg.rank, values)
    }
}
