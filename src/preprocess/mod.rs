//! Relational tables → the on-disk format (offline; may allocate freely).
//!
//! The Python front end reads sources (RelBench folders, DuckDB, SQLite,
//! Parquet/CSV), resolves keys and infers semantic types; it hands this module
//! typed column arrays. This module owns everything that decides bytes on
//! disk: z-scoring and statistics, category and text dictionaries, the CSR
//! graph with time-sorted children, task files, checksums, the content hash,
//! and the atomic publish of the finished directory (the writer, `writer/`),
//! plus the offline `hash` embedder and the synthetic databases of tests and
//! benches. What grows with the rows while it is built (scratch arrays, the
//! reverse CSR, the distinct texts) is held by `crate::spill`, below this
//! room, in page cache rather than private memory.
//!
//! Invariants: output is written into a staging sibling (`<out>.partial`) and
//! renamed into place only when complete, so an interrupted run never leaves a
//! directory that opens as a database. Tables are added in a fixed order and
//! every global index (row, column, category, text) is allocated in that
//! order, so a restarted run may reuse the longest prefix of finished tables.

mod hash_embed;
mod stats;
#[cfg(any(test, feature = "testing"))]
mod synth;
mod writer;

pub use hash_embed::hash_embed;
pub use stats::{column_stats, RunningStats};
#[cfg(any(test, feature = "testing"))]
pub use synth::{synth_database, SynthSpec};
pub use writer::{
    ColumnData, ColumnInput, DatabaseWriter, ForeignKeyInput, TableInput, TableSpec, TaskInput,
    TaskTarget,
};
