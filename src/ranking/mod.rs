//! The example rankings of in-context contexts (`examples = true`,
//! docs/contexts.md): which rows of the seed's table, best first, a context
//! takes as tier-1 examples, and the structures they are computed from.
//!
//! - `rankers.rs`: the rankers (`walks`, `adaptive`, `expected`, and the
//!   measurement-only `shuffled`) behind one call, [`rankers::rank`];
//! - `walks.rs`: random walks from the seed and the visit counts they
//!   give ([`walks::WalkCounts`]);
//! - `walk_graph.rs` (and `walk_graph/file.rs`): the FK graph as the walks
//!   read it, built once per host into the database directory and mapped;
//! - `expected.rs`: the visit counts the walks are expected to give,
//!   spread over the graph without drawing a walk;
//! - `rank_store/`: the `expected` ranker's rankings computed once per
//!   database and read back by every context (`item.rs`: one item's heads
//!   and bytes; `rice.rs`: the codes of its rows; `derived.rs`: the header,
//!   write and build lock of every derived file).
//!
//! Never: a BFS, a context's assembly or its budget (those are
//! `crate::context`, which calls [`rankers::rank`]), or a tensor. This room
//! reads the database's graph and nothing of the sampler above it.

pub mod expected;
pub mod rank_store;
pub mod rankers;
mod walk_graph;
pub mod walks;
