//! What the sampler says to a user who set up no logging: each message goes
//! to `tracing` (at warn or info level) and, when no subscriber is
//! installed, to stderr with a `headwater:` prefix, so a sampler used
//! without tracing still says what it did (a database dropped, a stored
//! file refused, a state resumed, a fault injected).
//!
//! Invariant: one line per message, the same words on both paths. Every
//! room says things through here; nothing else writes to stderr.

/// A warning: `tracing::warn!`, or `headwater: warning: <msg>` on stderr.
pub(crate) fn warn(msg: &str) {
    tracing::warn!("{msg}");
    if !tracing::dispatcher::has_been_set() {
        eprintln!("headwater: warning: {msg}");
    }
}

/// A notice: `tracing::info!`, or `headwater: <msg>` on stderr.
pub(crate) fn info(msg: &str) {
    tracing::info!("{msg}");
    if !tracing::dispatcher::has_been_set() {
        eprintln!("headwater: {msg}");
    }
}
