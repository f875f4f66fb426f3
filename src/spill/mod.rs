//! What preprocessing holds that grows with the rows, kept in page cache
//! instead of private memory: file-backed scratch arrays (`arrays.rs`:
//! [`SpillArray`], [`SpillVec`]) and the two structures built in them, the
//! graph's time-sorted reverse CSR (`graph.rs`: [`build_reverse`], and the
//! streamed writes of both halves of `graph.bin`) and the database's
//! distinct text values (`texts.rs`: `TextTable`).
//!
//! Never: a decision about a column's encoding, the staging directory or
//! the publish (those are `crate::preprocess`'s writer, which builds on
//! this room), or private memory proportional to the rows beyond a bounded
//! buffer.

mod arrays;
mod graph;
mod texts;

pub use arrays::{SpillArray, SpillVec};
pub use graph::{build_reverse, write_forward, write_reverse, ReverseCsr};
pub(crate) use texts::TextTable;
