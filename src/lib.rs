//! headwater: an observability-first sampler that turns a relational database
//! into training batches for relational transformers.
//!
//! Module map (one job per folder; see ARCHITECTURE.md):
//! - [`format`]: the on-disk format — byte layout, headers, writer, mmap reader.
//! - [`preprocess`]: relational tables → format (offline).
//! - [`error`]: the crate's error type.
//! - `python` (feature `python`): the PyO3 binding layer, the only place pyo3 appears.

pub mod batch;
pub mod bench;
pub mod config;
pub mod error;
pub mod format;
pub mod pipeline;
pub mod prefetch;
pub mod preprocess;
pub mod probes;
pub mod readings;
pub mod rng;
pub mod sampler;
pub mod seeds;
pub mod telemetry;

#[cfg(feature = "python")]
mod python;

pub use batch::Batch;
pub use config::{SamplerConfig, TaskPick};
pub use error::{Error, Result};
pub use format::{Database, Metadata, SemanticType};
pub use pipeline::Sampler;
pub use seeds::Split;
