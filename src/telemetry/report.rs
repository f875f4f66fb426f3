//! The per-batch report: everything telemetry knows about one delivered
//! batch, filled once by the pipeline (which sees both the batch and the
//! consumer) and read by every recorder through the metric table.
//!
//! Telemetry never sees a `Batch`: this report is the only input, so the
//! arrow points one way (`pipeline` → `telemetry`, `pipeline` → `batch`).

use crate::seeds::DrawStats;

/// One sequence of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SeqReport {
    /// BFS hops reached.
    pub depth: f64,
    /// Rows included.
    pub rows: f64,
    /// Padded share of the sequence (`1 - cells / S`).
    pub padding: f64,
    /// Cells of reached rows cut by the sequence budget.
    pub cells_dropped: f64,
    /// Visible children not sampled because of the width cap.
    pub children_capped: f64,
    /// Children hidden by the observation-time filter.
    pub temporal_filtered: f64,
    /// Included rows with a time after the seed's observation time.
    pub temporal_leaks: f64,
    /// Seeds' contexts (segments) in the sequence.
    pub segments: f64,
    /// Contexts cut by a packing budget below `S`.
    pub contexts_cut: f64,
}

/// One delivered batch, as telemetry sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchReport {
    /// Task of the batch (mixture order).
    pub task: usize,
    /// Database of the batch (mixture index; 0 for one database).
    pub db: usize,
    /// Seeds drawn (`B`, or `B·pack_factor` with `pack`).
    pub seeds: f64,
    /// Pool and mix state right after the batch's seeds were drawn.
    pub draw: DrawStats,
    /// Pools that ran out while drawing the batch.
    pub exhaust_events: f64,
    /// Seeds drawn twice within one epoch.
    pub duplicate_seeds: f64,
    /// Wall time of BFS, assembly, text collation and the whole batch (s).
    pub stage_seconds: [f64; 4],
    /// Batches waiting in the channel when the consumer asked.
    pub queue_depth: f64,
    /// Time the consumer blocked for this batch (s).
    pub wait_seconds: f64,
    /// Restores from a saved state since the previous delivered batch.
    pub resumes: f64,
    /// Seconds it took to open the database and prepare the sampler.
    pub startup_seconds: f64,
    /// One entry per sequence.
    pub seqs: Vec<SeqReport>,
}
