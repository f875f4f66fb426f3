//! Fault injection for the diagnostic configs (`debug_*` sampler keys,
//! `diag_configs/`): what proves each signal fires — a stuck worker, a cold
//! page cache, a thread pinned to one CPU, a build that burns CPU, a busy
//! thread on the sampler's CPU (`inject.rs`, named so a stall dump's frame
//! says where it is stuck), a page cache smaller than the corpus
//! (`cache.rs`). The maker and the producers call it; it knows
//! nothing of either.
//!
//! Never: used by a healthy run, or a change to what a batch contains (each
//! fault only costs time).

mod cache;
mod inject;

pub(crate) use cache::SmallCache;

pub(crate) use inject::{drop_page_cache, injected_spin, injected_stall, pin_to, Hog};
