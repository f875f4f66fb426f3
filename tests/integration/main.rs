//! Rust integration tests (one binary): the golden v1 database, corrupt and
//! truncated files, fuzzed payloads, the writer driven from Rust, and property tests of the
//! sampler on random synthetic databases, and the source layout rule.

mod eval;
mod format;
mod fuzz;
mod golden_batches;
mod layout;
mod mixture;
mod oracle;
mod packing;
mod props;
mod resume;
mod sampler;
mod scratch;
mod support;
mod writer;
