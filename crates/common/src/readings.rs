//! The measurement vocabulary: every reading the sampler takes of a batch,
//! in one place on the ground floor.
//!
//! Producers fill these where the thing happens — the draw
//! ([`DrawReadings`], on the producer thread right after a batch's seeds are
//! drawn), the BFS and assembly ([`SeqReadings`], per sequence), the batch
//! maker ([`BatchReadings`]: stage times, pool events) and the consumer side
//! of the pipeline ([`DeliveryReadings`]: queue depth, wait). Telemetry only
//! reads them, through the metric table (`crate::telemetry::METRICS`): the
//! drain, Prometheus and OTLP never re-derive a value from a domain object,
//! and a `Batch` carries tensors, not readings.
//!
//! Adding a measurement: a field here, the line that measures it where it
//! happens, and its row in the metric table.
//!
//! This module imports nothing from the crate: every room may fill it.

/// Pool and mix state right after a batch's seeds were drawn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrawReadings {
    /// Seeds left before reshuffle, least full active pool.
    pub remaining_min: f64,
    /// Seeds left before reshuffle, fullest active pool.
    pub remaining_max: f64,
    /// Remaining / pool size, least full active pool.
    pub remaining_fraction_min: f64,
    /// Remaining / pool size, fullest active pool.
    pub remaining_fraction_max: f64,
    /// Batches since the least recently picked weighted task was picked.
    pub steps_since_pick_max: f64,
    /// Forecast batches until the first active pool runs out.
    pub steps_to_exhaust_min: f64,
    /// Total-variation distance of the recent mix from the weights.
    pub tv_distance: f64,
    /// Total-variation distance of the recent database mix from the
    /// database shares (0 for one database).
    pub database_tv_distance: f64,
    /// Batches since the least recently picked database with share > 0 was
    /// picked.
    pub database_steps_since_pick_max: f64,
    /// Mixture index of that database (the pointer to the worst one).
    pub database_steps_since_pick_worst: f64,
    /// Least remaining / pool size over the active pools of databases with
    /// share > 0 (the least full database's least full pool).
    pub database_remaining_fraction_min: f64,
    /// Mixture index of that database.
    pub database_remaining_fraction_worst: f64,
    /// The batch's database has its own telemetry series (listed in
    /// `telemetry_databases`, or else one of the top
    /// `telemetry_top_databases`); else its seeds count as `other`.
    pub database_reported: bool,
    /// Databases of the mixture dropped at open (`on_bad_database`).
    pub dropped_databases: f64,
    /// Per reported database (schema order): its own pool and pick state.
    pub databases: Vec<DatabaseDraw>,
}

/// One reported database's state right after a batch's seeds were drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DatabaseDraw {
    /// Batches since the database was last picked.
    pub steps_since_pick: f64,
    /// Least remaining / pool size over its active weighted pools.
    pub remaining_fraction_min: f64,
}

/// One sequence of a batch, as its builder measured it (BFS and assembly).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SeqReadings {
    /// BFS hops reached.
    pub depth: u8,
    /// Rows included.
    pub rows: u32,
    /// Cells filled (the rest of S is padding).
    pub cells: u32,
    /// Cells of reached rows cut by the sequence budget.
    pub cells_dropped: u64,
    /// Visible children not sampled because of the width cap.
    pub children_capped: u64,
    /// Children hidden by the observation-time filter.
    pub temporal_filtered: u64,
    /// Included rows dated after the seed's observation time (must be 0).
    pub temporal_leaks: u64,
    /// Label cells shown although not known at the seed's time (must be 0).
    pub label_leaks: u64,
    /// Segments (seeds' contexts) in the sequence.
    pub segments: u32,
    /// Contexts cut to the prefix of their rows that fits a packing budget
    /// below `S` (always 0 without `pack`).
    pub contexts_cut: u32,
    /// With `examples`: cells of each tier of the context (0: the seed's
    /// BFS, 1: ranked examples' shells, 2: random examples' shells).
    pub tier_cells: [u32; 3],
    /// With `examples`: example rows (tiers 1 and 2) in the sequence.
    pub examples: u32,
    /// With `examples`: random-walk steps taken building the context.
    pub walk_steps: u64,
    /// With `examples`: 1 when the build passed `context_deadline_ms` and
    /// was replaced by the seed's plain BFS context.
    pub deadline_hits: u32,
    /// With `expected_store`: 1 when the stored ranking ran out and the
    /// live ranker built the context.
    pub store_misses: u32,
    /// With `mask_prob_max > 0`: cells masked as extra targets.
    pub masked_cells: u32,
    /// With `examples`: 1 when the context, built in time, holds no example
    /// (no eligible row of the seed's table, or no room after tier 0).
    pub no_examples: u32,
    /// Link tasks with `examples`: example labels shown that are positive
    /// (a candidate linked within its window).
    pub positive_examples: u32,
}

/// Index of each stage in [`BatchReadings::stage_ns`].
pub mod stage {
    /// The BFS of every context (and packing's placement and cuts).
    pub const BFS: usize = 0;
    /// Assembling the sequences' tensors.
    pub const ASSEMBLE: usize = 1;
    /// Collating the batch's texts.
    pub const COLLATE: usize = 2;
    /// The whole batch, planning included.
    pub const TOTAL: usize = 3;
}

/// The task kinds whose contexts telemetry counts apart
/// (`task_kinds/{kind}`), in series order: a task's `kind` in the database
/// metadata, and last `other` for any kind not named before it. A new
/// kind is one more name before `other`.
pub const TASK_KINDS: &[&str] = &["cell", "sql", "relbench", "link", "other"];

/// The [`TASK_KINDS`] index of a task of kind `kind` (`other` when it is
/// not named).
pub fn task_kind_index(kind: &str) -> usize {
    let last = TASK_KINDS.len() - 1;
    TASK_KINDS[..last]
        .iter()
        .position(|&k| k == kind)
        .unwrap_or(last)
}

/// One batch as its producer measured it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchReadings {
    /// Task of the batch (mixture order).
    pub task: u32,
    /// Database of the batch (mixture index; 0 for one database).
    pub db: u32,
    /// Seeds drawn (`B`, or more with `pack`).
    pub seeds: u32,
    /// Sequence length `S` of the batch (the step's draw from
    /// `sequence_lengths`, else `default_sequence_length`).
    pub seq_len: u32,
    /// Pool and mix state right after the batch's seeds were drawn.
    pub draw: DrawReadings,
    /// Pools that ran out while drawing the batch.
    pub exhaust_events: u32,
    /// Seed windows opened while drawing the batch (`seed_windows > 1`).
    pub window_rotations: u32,
    /// 1 when the batch's step starts a hot set's span (`hot_set_bytes`).
    pub hot_set_rotations: u32,
    /// Bytes of a hot set's next group the read-ahead asked the kernel for,
    /// reported with this batch.
    pub prefetched_bytes: u64,
    /// Seeds drawn twice within one epoch (must stay 0).
    pub duplicate_seeds: u32,
    /// Wall time of each [`stage`] (ns).
    pub stage_ns: [u64; 4],
    /// Major page faults (pages read from disk) taken building the batch.
    pub major_faults: u64,
    /// Bytes read from storage building the batch (`crate::probes`).
    pub read_bytes: u64,
    /// Stored bytes of what the batch used: its cells (at the database's
    /// mean stored bytes per cell) and the text embeddings it collated —
    /// the denominator of the read amplification.
    pub useful_bytes: u64,
    /// Pages of the batch's working set probed for residency (sampled
    /// cells of the rows its contexts hold, in their table files, just
    /// before assembly read them).
    pub pages_probed: u32,
    /// Of those, the pages that were already in the page cache.
    pub pages_resident: u32,
    /// CPU time of the thread that built the batch (ns).
    pub cpu_ns: u64,
    /// Time that thread was runnable but waiting for a CPU (ns), from the
    /// end of its previous build to the end of this one (`start_wait_ns`
    /// included).
    pub runqueue_ns: u64,
    /// Of that, the wait before the build began (woken for the job, waiting
    /// for a CPU; ns).
    pub start_wait_ns: u64,
    /// Wall time of the window the probes cover (the build and the
    /// run-queue wait before it, planning excluded; ns): what is neither CPU
    /// nor run-queue time in it was spent blocked (page faults, reads,
    /// locks).
    pub probed_ns: u64,
    /// The batch's draw or build ran past `stall_after_ms` (0, 1 or 2),
    /// plus its contexts past `context_deadline_ms` (`deadline_hits`).
    pub stalls: u32,
    /// Stall stack dumps that could not be written (reported with the next
    /// batch made after the failure).
    pub stall_dump_failures: u32,
    /// The split's first batch made after the open: nanoseconds from the
    /// start of the open until it was made (0 for every other batch).
    pub first_batch_ns: u64,
    /// The databases' block checks so far, as the batch was finished.
    pub integrity: IntegrityReadings,
    /// Distinct tasks among the batch's sequences (1 for a one-task step;
    /// more with `task_mixing = "sequence"`).
    pub tasks: u32,
    /// With several tasks in the batch: (task, seeds drawn for it); empty
    /// when every seed is of `task`.
    pub task_seeds: Vec<(u32, u32)>,
    /// With sequences of several databases in the batch: (database,
    /// seeds drawn from it, whether it has its own telemetry series);
    /// empty when every seed is of `db`.
    pub db_seeds: Vec<(u32, u32, bool)>,
    /// Seeds (contexts) of each task kind, by [`TASK_KINDS`] index: they
    /// sum to `seeds`.
    pub kind_seeds: [u32; TASK_KINDS.len()],
    /// The least candidate recall (training groups, measured by
    /// preprocessing) of the batch's link tasks; `None` without one.
    pub link_candidate_recall: Option<f64>,
    /// One entry per sequence.
    pub seqs: Vec<SeqReadings>,
}

/// How the bytes the sampler has read were checked, summed over its
/// databases since they were opened (totals, not per batch: a block is
/// checked once, by whichever batch reads it first).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IntegrityReadings {
    /// Blocks hashed on their first read and found intact.
    pub blocks_verified: u64,
    /// Blocks first read with no checksum to check (format-1 files opened
    /// without `verify="full"`); 0 = every byte in every batch was checked.
    pub unverified_reads: u64,
}

/// What the consumer side of the pipeline measured when it handed a batch
/// over.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeliveryReadings {
    /// Batches waiting in the channel when the consumer asked.
    pub queue_depth: f64,
    /// Time the consumer blocked for this batch (s).
    pub wait_seconds: f64,
    /// Restores from a saved state since the previous delivered batch.
    pub resumes: f64,
    /// Seconds it took to open the database and prepare the sampler.
    pub startup_seconds: f64,
    /// Seconds from the start of the open until the split's first batch
    /// was made (0 until it is delivered).
    pub first_batch_seconds: f64,
}
