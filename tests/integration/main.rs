//! Rust integration tests (one binary): the golden v1 database, corrupt and
//! truncated files, and the writer driven from Rust.

mod format;
mod support;
mod writer;
