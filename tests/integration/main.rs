//! Rust integration tests (one binary): the golden v1 database, corrupt and
//! truncated files, fuzzed payloads, the writer driven from Rust, and property tests of the
//! sampler on random synthetic databases, and the source layout rule.

// Tests and benches spell out their cases in line; the 80-line bound on
// functions (clippy.toml) is for the library.
#![allow(clippy::too_many_lines)]

mod eval;
mod example_splits;
mod forecast;
mod format;
mod fuzz;
mod golden_batches;
mod hot_sets;
mod incontext;
mod integrity;
mod layout;
mod memory;
mod mixture;
mod oracle;
mod packing;
mod past_stats;
mod props;
mod rank_store;
mod resume;
mod sampler;
mod scratch;
mod support;
mod threads;
mod varlen;
mod walks;
mod writer;
