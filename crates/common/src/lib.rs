//! headwater's lowest floor: what every other crate of the workspace may
//! use and what uses nothing of theirs.
//!
//! - [`error`]: the error type every fallible function returns.
//! - [`readings`]: the measurement vocabulary every producer fills and
//!   telemetry only reads.
//! - [`probes`]: kernel readings (page faults, bytes read, CPU and run-queue
//!   time).
//! - [`rng`]: pinned generators; [`prefetch`]: the software-prefetch hint.

pub mod error;
pub mod prefetch;
pub mod probes;
pub mod readings;
pub mod rng;

pub use error::{Error, Result};
