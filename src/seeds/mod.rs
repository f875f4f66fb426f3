//! Which seeds a rank trains on, and in what order.
//!
//! - [`split`]: `stable_hash(task_idx, anchor_row, split_seed) % 1000`
//!   against the split ratios — independent of `seed`, `rank`, `world_size`;
//!   then rank `r` owns the split's seeds at positions `i % world_size == r`.
//! - [`SeedPool`]: one shuffled pool per (task, split) per rank, drawn by a
//!   cursor; running out reshuffles (a new epoch) and is an exhaust event.
//! - [`TaskPicker`]: one task per batch, weighted random or round-robin.
//!
//! Invariants: splits of a task are disjoint and cover its seeds; shards of a
//! split are disjoint and cover it; within one epoch a pool yields each of its
//! seeds exactly once (the pool checks this itself and counts violations).

mod mix;
mod picker;
mod pool;
pub mod split;

pub use mix::{DrawStats, MixWindow};
pub use picker::TaskPicker;
pub use pool::{Draw, SeedPool};
pub use split::{shard, split_of, Split};
