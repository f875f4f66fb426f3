"""Stopping ``headwater train`` on SIGTERM/SIGINT: :class:`StopFlag` (set
by the signal, read by the step loop, which stops after the current step and
checkpoints; the ranks agree on it through the step's shape agreement,
:meth:`headwater.cluster.mesh.Mesh.agree`),
:class:`StartupInterrupted` (a signal before the first step stops at once)
and the line that acknowledges a signal the moment it arrives.

Must never: leave a signal unacknowledged while the main thread is inside
a long native call, or stop a rank before the step the ranks agreed on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

#: Seconds a signal during start-up waits for the main thread to take it
#: before the acknowledging thread ends the process.
STARTUP_GRACE_S = 2.0


class StartupInterrupted(KeyboardInterrupt):
    """SIGTERM/SIGINT before the first step: nothing trained, nothing to
    checkpoint, so the start-up stops at once."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"{name} during start-up: stopped before the first step (no checkpoint)")


class StopFlag:
    """SIGTERM/SIGINT set :attr:`signum`; the loop stops after the current
    step. ``hard_on_second``: a second signal gets the previous handler
    (Ctrl-C twice: out now); a worker leaves that to its launcher (Ctrl-C
    reaches it directly and forwarded). ``abort_startup``: a signal before
    the loop sets :attr:`training` raises :class:`StartupInterrupted` (no
    step to finish, no checkpoint to write). ``announce``: acknowledge each
    signal on stderr the moment it arrives, from a thread woken by the C
    signal handler (:func:`signal.set_wakeup_fd`), even while the main
    thread is inside a long native call (a compilation, a device wait)."""

    def __init__(
        self, hard_on_second: bool = False, announce: bool = False, abort_startup: bool = False
    ) -> None:
        self.signum = 0
        self.hard_on_second = hard_on_second
        self.announce, self.abort_startup = announce, abort_startup
        #: Set by the step loop once its first step has run (compiled): a
        #: signal then waits for the current step and its checkpoint.
        self.training = False
        #: Set by the loop for the final validation and evaluation (the
        #: trained model is already checkpointed: a signal ends the pass).
        self.final_phase = False
        self.previous: dict[int, Any] = {}
        self._wakeup: tuple[Any, Any, int] | None = None
        self._unraisable: Any = None
        self._acked = 0
        #: Signals the Python handler has run for (the main thread's view).
        self._handled = 0

    def install(self) -> StopFlag:
        for s in (signal.SIGTERM, signal.SIGINT):
            self.previous[s] = signal.signal(s, self._handle)
        if self.abort_startup:
            self._unraisable = sys.unraisablehook
            sys.unraisablehook = self._unraisable_hook
        if self.announce:
            self._start_acknowledger()
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._handled += 1
        if self.signum and self.hard_on_second:
            self.restore()
            signal.raise_signal(signum)
            return
        self.signum = self.signum or signum
        if self.abort_startup and not self.training:
            raise StartupInterrupted(signum)

    def recheck_startup(self) -> None:
        """Raise :class:`StartupInterrupted` for a start-up signal whose
        exception was lost: Python runs a signal handler between any two
        bytecodes, also inside a callback whose exceptions it only prints
        (JAX's garbage-collection callback during a compilation), so the
        raise in :meth:`_handle` can vanish and start-up would go on."""
        if self.abort_startup and not self.training and self.signum:
            raise StartupInterrupted(self.signum)

    def _unraisable_hook(self, unraisable: Any) -> None:
        """A :class:`StartupInterrupted` dropped inside such a callback is
        not printed as a traceback (the loop's :meth:`recheck_startup`
        raises it again); anything else goes to the previous hook."""
        if isinstance(unraisable.exc_value, StartupInterrupted):
            return
        (self._unraisable or sys.__unraisablehook__)(unraisable)

    def _start_acknowledger(self) -> None:
        import socket
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        r, w = socket.socketpair()
        w.setblocking(False)
        try:
            old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        except ValueError:
            r.close()
            w.close()
            return
        self._wakeup = (r, w, old)
        threading.Thread(
            target=self._acknowledge, args=(r,), name="headwater-signal-ack", daemon=True
        ).start()

    def _acknowledge(self, r: Any) -> None:
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            for b in data:
                if b in (signal.SIGTERM, signal.SIGINT):
                    self._acked += 1
                    print(acknowledgement(b, self._acked, self), file=sys.stderr, flush=True)
                    if self.abort_startup and not self.training:
                        self._exit_if_stuck(b, self._acked)

    def _exit_if_stuck(self, signum: int, nth: int) -> None:
        """During start-up the main thread may be inside a long native call
        (XLA compiling the step) where no Python signal handler runs; there
        is nothing to save yet, so if it has not taken the signal within
        :data:`STARTUP_GRACE_S`, the process exits from here."""
        deadline = time.monotonic() + STARTUP_GRACE_S
        while time.monotonic() < deadline:
            if self._handled >= nth or self.training:
                return
            time.sleep(0.05)
        print(
            f"headwater train: {signal.Signals(signum).name} during start-up (the main thread "
            "is busy in native code, e.g. compiling): exiting now, nothing was trained",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(128 + signum)

    def restore(self) -> None:
        for s, h in self.previous.items():
            # None: a handler installed outside Python (jax.distributed's
            # preemption notifier); it cannot be put back, the default can.
            signal.signal(s, signal.SIG_DFL if h is None else h)
        self.previous.clear()
        if self._unraisable is not None:
            if sys.unraisablehook == self._unraisable_hook:
                sys.unraisablehook = self._unraisable
            self._unraisable = None
        if self._wakeup is not None:
            r, w, old = self._wakeup
            self._wakeup = None
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(old)
            w.close()  # the acknowledger reads EOF and ends
            r.close()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


def acknowledgement(signum: int, nth: int, flag: StopFlag) -> str:
    """The line printed the moment a signal arrives."""
    name = signal.Signals(signum).name
    if nth > 1 and flag.hard_on_second:
        return f"headwater train: {name} again: stopping now"
    if flag.abort_startup and not flag.training:
        return f"headwater train: {name} received during start-up: stopping now (nothing to save)"
    if flag.final_phase:
        return (
            f"headwater train: {name} received: stopping the final evaluation at its next batch "
            "(the trained model is already checkpointed)…"
        )
    again = " (send it again to stop at once, without a checkpoint)" if flag.hard_on_second else ""
    return (
        f"headwater train: {name} received: stopping after the current step, then saving a "
        f"checkpoint…{again}"
    )
