//! `Gate`: the per-split delivery lock, a lock whose wait can time out and
//! is cut short by shutdown.
//!
//! A consumer holds its split's gate ([`Turn`]) from taking a batch off the
//! channel until the delivered state has advanced past it and the batch is
//! recorded in telemetry, so concurrent consumers take batches one at a time
//! in step order; a restart (`skip`, `load_state`) holds it too, so it never
//! lands between a consumer's receive and its advance. Waiters must wake to
//! check signals (Ctrl-C) and shutdown, which a `std::sync::Mutex` cannot
//! do: the gate is a one-slot channel holding one token, taken to enter and
//! put back when the [`Turn`] drops (also when its holder unwinds, so a
//! panic never poisons it). Uncontended, entering is one `try_recv` and
//! leaving one `try_send`: no allocation, no system call.
//!
//! Never: hold a turn across a wait that has no deadline and ignores
//! shutdown, or enter a second gate before the first (lane order, when a
//! caller holds several).

use std::time::Instant;

use crossbeam_channel::{bounded, never, select, Receiver, Sender};

use crate::error::{Error, Result};

/// A lock over one split's delivery (see the module doc).
pub struct Gate {
    token_tx: Sender<()>,
    token_rx: Receiver<()>,
}

/// The right to deliver from (or restart) a gate's split; leaving the gate
/// is dropping it.
#[must_use = "the gate is left when the turn is dropped"]
pub struct Turn<'a> {
    gate: &'a Gate,
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    /// An open gate.
    pub fn new() -> Gate {
        let (token_tx, token_rx) = bounded(1);
        token_tx
            .send(())
            .expect("a fresh one-slot channel has room");
        Gate { token_tx, token_rx }
    }

    /// Enter the gate, waiting until `deadline` (`None`: as long as it
    /// takes) and while `stop` (a shutdown channel, whose senders are
    /// dropped at shutdown) stays open. `Ok(None)`: the deadline passed;
    /// `Err(Shutdown)`: `stop` closed first.
    pub fn enter(
        &self,
        deadline: Option<Instant>,
        stop: Option<&Receiver<()>>,
    ) -> Result<Option<Turn<'_>>> {
        if self.token_rx.try_recv().is_ok() {
            return Ok(Some(Turn { gate: self }));
        }
        let none = never();
        let stop = stop.unwrap_or(&none);
        let entered = if let Some(d) = deadline {
            select! {
                recv(self.token_rx) -> _ => true,
                recv(stop) -> _ => return Err(Error::Shutdown),
                default(d.saturating_duration_since(Instant::now())) => false,
            }
        } else {
            select! {
                recv(self.token_rx) -> _ => true,
                recv(stop) -> _ => return Err(Error::Shutdown),
            }
        };
        Ok(entered.then_some(Turn { gate: self }))
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // The token is out while a turn lives: the slot is free.
        let _ = self.gate.token_tx.try_send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_turn_at_a_time_and_a_timed_out_wait_returns_none() {
        let g = Gate::new();
        let t = g.enter(None, None).unwrap().unwrap();
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert!(g.enter(soon, None).unwrap().is_none());
        drop(t);
        assert!(g.enter(soon, None).unwrap().is_some());
    }

    #[test]
    fn a_closed_stop_channel_wakes_a_waiter_with_shutdown() {
        let g = Gate::new();
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let _t = g.enter(None, None).unwrap().unwrap();
        drop(stop_tx);
        assert!(matches!(
            g.enter(None, Some(&stop_rx)),
            Err(Error::Shutdown)
        ));
    }

    #[test]
    fn a_panic_while_holding_a_turn_leaves_the_gate_open() {
        let g = Gate::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _t = g.enter(None, None).unwrap().unwrap();
            panic!("consumer failed");
        }));
        assert!(r.is_err());
        assert!(g.enter(Some(Instant::now()), None).unwrap().is_some());
    }
}
