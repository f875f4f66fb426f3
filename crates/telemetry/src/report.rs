//! The per-batch report: what every recorder is handed for one delivered
//! batch — the producer's readings and the consumer side's, both from the
//! measurement vocabulary (`headwater_common::readings`), read and never copied.
//!
//! Telemetry never sees a `Batch`: the readings are its only input, so the
//! arrows point one way (`sampler` → `telemetry` → `readings`).

use headwater_common::readings::{BatchReadings, DeliveryReadings};

/// One delivered batch, as telemetry sees it.
#[derive(Debug, Clone, Copy)]
pub struct BatchReport<'a> {
    /// What the producer measured while drawing and building the batch.
    pub batch: &'a BatchReadings,
    /// What the consumer side measured when it handed the batch over.
    pub delivery: DeliveryReadings,
}

impl BatchReport<'_> {
    /// The batch's task (mixture order).
    pub fn task(&self) -> usize {
        self.batch.task as usize
    }

    /// The batch's database (mixture index).
    pub fn db(&self) -> usize {
        self.batch.db as usize
    }

    /// Seeds drawn for the batch.
    pub fn seeds(&self) -> f64 {
        f64::from(self.batch.seeds)
    }
}
