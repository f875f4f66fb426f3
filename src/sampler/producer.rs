//! The producer thread of one split: it streams the split's batches
//! ([`SamplerCore::stream_batches`]) into a bounded channel, stopping on
//! shutdown, on a restart (its halt channel dropped) or before a batch that
//! would take private memory past `max_rss_bytes`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, select, Receiver, Sender};

use super::{current_private_bytes, MadeBatch, SamplerCore, SplitState, PRODUCED};
use crate::error::{Error, Result};

/// A running producer: its channel, thread and halt switch.
pub(super) struct Producer {
    pub(super) rx: Receiver<Result<MadeBatch>>,
    pub(super) handle: Option<JoinHandle<()>>,
    /// Dropped to stop this producer alone (a restart).
    pub(super) halt: Option<Sender<()>>,
    /// The drop set generation its state was made under: a batch of an
    /// older one than the core's is remade (`crate::maker`'s `drops.rs`).
    pub(super) generation: u64,
}

/// The error to stop with when building the next batch would take the
/// process's private memory past `cap` (`None`: it fits, or memory cannot
/// be read), counting the `building` batches in flight as not yet
/// allocated. The batch size is predicted from this split's last batch.
fn over_cap(
    core: &SamplerCore,
    state: &SplitState,
    building: usize,
    tx: &Sender<Result<MadeBatch>>,
    cap: u64,
) -> Option<Error> {
    let private = current_private_bytes()?;
    let next = state.predicted_batch_bytes(&core.cfg, core.segment_slots(), core.embedding_dim());
    // The batches being built may not have allocated yet: count them too.
    if private.saturating_add(next.saturating_mul(building as u64 + 1)) <= cap {
        return None;
    }
    let queued = tx.len() as u64;
    let per_split = (core.cfg.num_prefetch + core.stream_depth()) as u64;
    let slots = per_split * PRODUCED.len() as u64;
    Some(Error::Resource(format!(
        "private memory (RssAnon) {private} bytes + the next {} batch (~{next} bytes) would exceed max_rss_bytes {cap}. \
         Prefetch queues: {queued} batches waiting in this split's queue (~{} bytes); at most {slots} batches \
         ({} queued + {} being built per split × {} splits, ~{} bytes) can be held; the rest ({} bytes) is the process \
         (interpreter, model, consumers' batches, sampler scratch). The mapped database is not counted. \
         Lower num_prefetch, num_threads, default_batch_size or default_sequence_length, or raise max_rss_bytes",
        state.split.name(),
        queued * next,
        core.cfg.num_prefetch,
        core.stream_depth(),
        PRODUCED.len(),
        slots * next,
        private.saturating_sub(queued * next),
    )))
}

fn produce(
    core: Arc<SamplerCore>,
    mut state: SplitState,
    tx: Sender<Result<MadeBatch>>,
    stop: Receiver<()>,
    halt: Receiver<()>,
    mut opened: Option<Instant>,
) {
    if let Some(cpu) = core.cfg.debug_pin_cpu {
        crate::faults::pin_to(cpu);
    }
    let depth = core.stream_depth();
    let cap = core.cfg.max_rss_bytes;
    core.stream_batches(
        &mut state,
        depth,
        |state, building| cap.and_then(|cap| over_cap(&core, state, building, &tx, cap)),
        |mut msg| {
            if let (Some(t), Ok(made)) = (opened, &mut msg) {
                // The split's first batch since the open (not a restart's).
                made.readings.first_batch_ns =
                    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                opened = None;
            }
            select! {
                send(tx, msg) -> sent => sent.is_ok(),
                recv(stop) -> _ => false,
                recv(halt) -> _ => false,
            }
        },
    );
}

/// Start a producer thread for `state`'s split; `opened`: when the open
/// began (the first batch's `first_batch_ns` counts from there; `None` for
/// a restart).
pub(super) fn spawn_producer(
    core: &Arc<SamplerCore>,
    state: SplitState,
    stop: &Receiver<()>,
    opened: Option<Instant>,
) -> Result<Producer> {
    let (split, generation) = (state.split, state.drop_generation());
    let (tx, rx) = bounded(core.cfg.num_prefetch);
    let (halt_tx, halt_rx) = bounded::<()>(0);
    let (c, s) = (core.clone(), stop.clone());
    let handle = std::thread::Builder::new()
        .name(format!("headwater-{}", split.name()))
        .spawn(move || produce(c, state, tx, s, halt_rx, opened))
        .map_err(|e| {
            Error::Worker(format!(
                "cannot start the {} producer thread: {e}",
                split.name()
            ))
        })?;
    Ok(Producer {
        rx,
        handle: Some(handle),
        halt: Some(halt_tx),
        generation,
    })
}
