//! headwater: an observability-first sampler that turns a relational database
//! into training batches for relational transformers.
//!
//! Module map (one job per room, arrows pointing down; see ARCHITECTURE.md):
//! - [`error`], [`rng`], [`prefetch`]: the crate's error type, pinned
//!   generators, the software-prefetch hint.
//! - [`readings`]: the measurement vocabulary every producer fills and
//!   telemetry only reads; [`probes`]: kernel readings (page faults, bytes
//!   read, CPU and run-queue time); [`stalls`]: the stall detector (stack
//!   dumps of sampler threads stuck past `stall_after_ms`).
//! - [`config`]: every sampler key once (`SamplerConfig`, the `FIELDS`
//!   table), parsed and validated at the edge.
//! - [`format`]: the on-disk format — byte layout, headers, writer, mmap
//!   reader, verification, page-cache modes.
//! - [`preprocess`]: relational tables → format (offline).
//! - [`seeds`]: splits, rank slices, seed pools, task picking.
//! - [`sampler`]: the BFS from a seed row.
//! - [`batch`]: subgraphs → the batch tensors (the one tensor list).
//! - [`pipeline`]: making batches (plan, draw, build), producers, delivery,
//!   evaluation passes, resume state.
//! - [`telemetry`]: the metric table, the drain and the exporters.
//! - [`bench`]: the measurement behind `headwater bench`.
//! - `python` (feature `python`): the PyO3 binding layer, the only place pyo3
//!   appears.

pub mod batch;
pub mod bench;
pub mod config;
pub mod pipeline;
pub mod preprocess;
pub mod sampler;
pub mod seeds;
pub mod stalls;

pub use headwater_common::{error, prefetch, probes, readings, rng};
pub use headwater_format as format;
pub use headwater_telemetry as telemetry;

pub use batch::Batch;
pub use config::{SamplerConfig, TaskPick};
pub use error::{Error, Result};
pub use format::{Database, Metadata, SemanticType};
pub use pipeline::Sampler;
pub use seeds::Split;
