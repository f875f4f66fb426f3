//! Which seeds a rank trains on, and in what order.
//!
//! The scheme (global pools, a global cursor, rank slices):
//! - [`split`]: `stable_hash(task_idx, anchor_row, split_seed) % 1000`
//!   against the split ratios — independent of `seed`, `rank`, `world_size`.
//!   A task with **stored splits** (RelBench: each label row keeps the split
//!   of the file it came from, train/val/test) uses those instead, and the
//!   split seed and ratios do not apply to it ([`task_split_seeds`]).
//!   A (task, split)'s **global pool** is its seeds in that split over all
//!   ranks ([`split_seeds`], then `pool_fraction`'s evenly spaced subset):
//!   identical on every rank.
//! - [`SeedPool`]: the order of a global pool. Epoch `e` reads the pool in
//!   the order of a keyed bijection `π_e` of `0..len` (a Feistel network,
//!   cycle-walked), keyed by (`seed`, split, task, `e`) — a function of those
//!   alone, computed per position and never stored. Absolute position `p`
//!   (counted from epoch 0) is seed `pool[π_{p / len}(p % len)]`.
//! - [`TaskPicker`]: the task of step `t` is a pure function of
//!   (`seed`, split, `t`) — weighted by a counter-based hash, or round robin
//!   `t mod (eligible tasks)` — so every rank picks the same task at the same
//!   step. A task is eligible when its weight is > 0 and its global pool in
//!   the split is not empty (the same on every rank).
//! - A split's stream state is one counter per task, `drawn[k]`: global
//!   positions consumed. At step `t` with task `k` and world size `W`, rank
//!   `r` draws positions [`rank_slice`] `drawn[k] + r·B .. drawn[k] + (r+1)·B`
//!   and `drawn[k]` advances by `W·B`. Positions past the end of an epoch
//!   continue in the next epoch's order (the step that crosses a boundary
//!   takes the end of epoch `e` and the start of `e + 1`); the draw at a
//!   position `p > 0` with `p mod len = 0` is an **exhaust event**. The
//!   per-sequence BFS generator is derived from (`seed`, split, `t`, global
//!   slot `r·B + j`), so nothing depends on the thread count.
//!
//! Why this resumes exactly and reshards without repeats or gaps: the state
//! is (step, `drawn[·]`, telemetry windows) and nothing rank-specific, so
//! every rank's state is the same value. The positions a step consumes are
//! the contiguous range `drawn[k] .. drawn[k] + W·B`, partitioned among the
//! ranks; consecutive steps consume consecutive ranges. So, whatever world
//! sizes the run had, the positions ever consumed from a pool are exactly
//! the prefix `0 .. drawn[k]` of the sequence (epoch 0 order, epoch 1
//! order, …), each consumed once, and each epoch's order is a permutation of
//! the pool: every seed is delivered exactly once per epoch across ranks.
//! Restoring `drawn[·]` and the step at the same world size reproduces the
//! same positions, picks and generators, hence bit-identical batches; at a
//! different world size the cursor simply continues (the only seeds of an
//! epoch not yet delivered when a run stops are those past its cursor).
//!
//! Invariants: splits of a task are disjoint and cover its seeds; the rank
//! slices of a step are disjoint and cover its `W·B` positions; every epoch
//! of a pool is a permutation of it (each [`SeedPool`] instance re-checks
//! this on the positions it draws and flags a repeat as a duplicate).

mod hot;
mod mix;
mod picker;
mod pool;
pub mod split;

pub use hot::HotSets;
pub use mix::MixWindow;
pub use picker::TaskPicker;
pub use pool::{epoch_cursor, Draw, SeedPool};
pub use split::{
    rank_slice, split_has_buckets, split_of, split_seeds, task_split_codes, task_split_seeds,
    Split, NO_SPLIT,
};
