//! headwater: an observability-first sampler that turns a relational database
//! into training batches for relational transformers.
//!
//! Module map (one job per room, arrows pointing down; see ARCHITECTURE.md).
//! The floors below the core are crates of their own, re-exported here
//! under their room names:
//! - [`error`], [`rng`], [`prefetch`], [`readings`], [`probes`]
//!   (`headwater-common`): the error type, pinned generators, the
//!   software-prefetch hint, the measurement vocabulary every producer fills
//!   and telemetry only reads, kernel readings.
//! - [`format`] (`headwater-format`): the on-disk format — byte layout,
//!   headers, writer, mmap reader, verification, page-cache modes.
//! - [`telemetry`] (`headwater-telemetry`): the metric table, the drain and
//!   the exporters.
//!
//! The core's rooms:
//! - [`config`]: every sampler key once (`SamplerConfig`, the `FIELDS`
//!   table), parsed and validated at the edge.
//! - [`spill`]: what preprocessing holds that grows with the rows, in page
//!   cache (spill arrays, the reverse CSR, the distinct texts).
//! - [`preprocess`]: relational tables → format (offline): the
//!   `DatabaseWriter`, statistics, the hash embedder, synthetic databases.
//! - [`seeds`]: splits, rank slices, seed pools, task picking.
//! - [`ranking`]: the example rankings of in-context contexts — the walk
//!   graph, random walks, expected visit counts, the rankers and the
//!   rankings stored per database.
//! - [`context`]: what context a seed gets — the BFS from a seed row, the
//!   in-context assembly of its tiers and when labels are known.
//! - [`batch`]: subgraphs → the batch tensors (the one tensor list).
//! - [`databases`]: the databases a sampler is made from, before any plan
//!   — their names in a mixture, opening (staged, a bad one dropped), the
//!   checks across a mixture, how their pages are read.
//! - [`stream`]: where each split's stream stands (`StreamState`), the
//!   keys that define it (`StreamConfig`) and its saved form
//!   (`SamplerState`).
//! - [`maker`]: making batches (plan, draw, build), the capture and restore
//!   of its streams.
//! - [`sampler`]: the [`Sampler`] — producers, delivery, evaluation passes,
//!   telemetry per split, save and restore.
//! - [`stalls`]: the stall detector (stack dumps of sampler threads stuck
//!   past `stall_after_ms`).
//! - `faults` (crate-private): the fault injection of the diagnostic
//!   configs (`debug_*` keys), which the maker and the producers call.
//! - [`bench`]: the measurement behind `headwater bench`.
//! - `say` (crate-private): what the sampler says to the user, through
//!   `tracing` or, with no subscriber, on stderr.
//!
//! The PyO3 binding is the crate above this one (`crates/python`).

pub mod batch;
pub mod bench;
pub mod config;
pub mod context;
pub mod databases;
pub(crate) mod faults;
pub mod maker;
pub mod preprocess;
pub mod ranking;
pub mod sampler;
pub(crate) mod say;
pub mod seeds;
pub mod spill;
pub mod stalls;
pub mod stream;

pub use headwater_common::{error, prefetch, probes, readings, rng};
pub use headwater_format as format;
pub use headwater_telemetry as telemetry;

pub use batch::Batch;
pub use config::{SamplerConfig, TaskPick};
pub use error::{Error, Result};
pub use format::{Database, Metadata, SemanticType};
pub use sampler::Sampler;
pub use seeds::Split;
