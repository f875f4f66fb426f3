//! The databases a sampler is made from, before any plan: their names in a
//! mixture and opening each one, staged when `stage_dir` is set, with what
//! dropping a bad one needs (`open.rs`); the checks across a mixture (one
//! embedder, distinct names) and errors that name their
//! database (`checks.rs`); how their pages are read given the memory the
//! process has (`memory.rs`).
//!
//! Never: a plan, a draw or a batch (the maker's, which prepares its
//! `SamplerCore` from what this room opened), or a change to what a batch
//! holds.

mod checks;
mod memory;
mod open;

pub(crate) use checks::{check_mixture, in_database, warn_stats_split};
pub(crate) use memory::plan_reads;
pub use memory::ReadPlan;
pub use open::DroppedDatabase;
pub(crate) use open::{database_names, forget_databases, open_one};
