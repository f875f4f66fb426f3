//! What context a seed gets: the BFS from a seed row over foreign-key
//! edges, with the time filter and width caps, and per-worker scratch
//! (`bfs.rs`); with `examples = true`, the in-context assembly of the tiers
//! (`incontext.rs`, tier 2 in `tier2.rs`), when a row's label is known
//! (`labels.rs`), a forecast task's items as examples (`items.rs`) and
//! which splits' labels a seed may see as examples (`splits.rs`). The
//! example rankings tier 1 is ordered by are `crate::ranking`, below this
//! room.
//!
//! BFS rules (docs/sampling.md): parents (F→P) first and without width cap; children
//! (P→F) only when visible at the seed's observation time (their table has no
//! time, or their time ≤ `obs_time`), then at most `bfs_child_width` of them,
//! uniformly; closest hop first, ties broken at random; rows are added whole
//! while they fit the cell budget; stop at the budget, `max_hops`, or an empty
//! frontier. With the filter on no row dated after `obs_time` is ever
//! included: a parent is always older than the row referencing it in
//! consistent data, but a row without a time can reference a future one, so
//! parents are checked against the cutoff too (their own time, one lookup).
//!
//! Hot-path invariants: no allocation per seed after warm-up (scratch is
//! cleared, not reallocated); the visited set is an epoch-stamped array, not a
//! hash set; the children visible at a cutoff are a prefix found by binary
//! search on the time-sorted CSR, so a hub with millions of children costs
//! O(width), never O(degree). The BFS never reads column data.

mod bfs;
pub mod incontext;
pub mod items;
pub mod labels;
pub mod splits;
mod tier2;

pub use bfs::{bfs, BfsParams, BfsScratch, Subgraph};
pub use incontext::{build_in_context, ExampleParams, ExampleScratch, SeqRecipe};
pub use items::{ItemIndex, TaskItems};
pub use labels::LabelTimes;
pub use splits::{row_codes, ExampleSplits};
