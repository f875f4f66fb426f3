"""The collective watchdog: a rank that stops (SIGKILL, a segfault, a hang,
SIGSTOP) is named by the others within ``train.peer_timeout_s``, which then
exit non-zero instead of hanging in, or dying with a raw traceback from, a
collective that can never complete.

Owns: :class:`Watchdog` (two daemon threads per rank of a multi-process
job), :class:`KvChannel` (heartbeats through ``jax.distributed``'s
key-value store, served by process 0's coordination service), the
process-wide instance (:func:`start`, :func:`current`, :func:`at_step`,
:func:`finish`, :func:`stop`, :func:`on_error`) and :func:`check_timeout`.

How: every ``beat_interval(timeout)`` seconds the *beat* thread writes
``"<seq> <state> <step>"`` under ``headwater/watchdog/<rank>`` and reads
every rank's key back (one ``key_value_dir_get``). A peer is lost when its
value has not changed over ``peer_timeout_s`` of successful reads, or when
it wrote ``failed`` (a Python error on that rank; it exits at once). The
*judge* thread only reads the clock and what the beat thread saw, so it
never blocks: when the key-value store itself stops answering for
``peer_timeout_s`` (process 0, which serves it, was killed or stopped), the
judge names rank 0. No clocks are compared across hosts: staleness is
measured on the observer's monotonic clock. A rank that ended its run
writes ``done`` and is watched no more (the others may still be finishing).

On a lost peer the judge thread prints which rank was lost and at which
step, writes ``watchdog-rank<r>.json`` into the run directory, puts the
same into rank 0's W&B run summary (bounded: a W&B that does not answer
within :data:`WANDB_WAIT_S` is left), flushes and ends the process with
``os._exit(EXIT_PEER_LOST)``: the main thread may be blocked inside a
collective (NCCL hangs on a dead peer), which no exception can interrupt.

What is checkpointed: nothing new. A checkpoint is collective (orbax's
commit waits for every process), so it cannot complete with a dead peer;
a survivor's main thread is, moreover, inside a step (or a collective)
whose update is half done. The last *committed* periodic checkpoint stays
valid (a save in flight is a temporary directory that the next start
removes) and is named with the command that resumes from it, both as the
run reports them (:data:`Recovery`, given to :func:`attach`).

A collective that fails instead of hanging (gloo on CPU: ``Connection reset
by peer``) raises in the main thread; :func:`on_error` then waits (up to
``peer_timeout_s`` and two beats) for the judge to name the rank, so the
survivor's last words name it too. Any other error is written as
``failed`` for the peers to see, and left to the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from headwater.errors import ConfigError

#: ``train.peer_timeout_s`` when not set.
DEFAULT_PEER_TIMEOUT_S = 60.0
#: The smallest accepted ``train.peer_timeout_s``: beats come every
#: timeout / 6 s (at least 0.2 s), and a Python thread on a loaded host is
#: late by hundreds of milliseconds.
MIN_PEER_TIMEOUT_S = 2.0
#: The largest (one day); ``jax.distributed``'s own heartbeat is set above it.
MAX_PEER_TIMEOUT_S = 86400.0
#: The exit status of a rank that lost a peer.
EXIT_PEER_LOST = 3
#: Seconds the W&B summary update and finish may take on the way out.
WANDB_WAIT_S = 5.0
KEY_PREFIX = "headwater/watchdog/"

#: What the run tells the watchdog to report on the way out (:func:`attach`):
#: given whether this process joined a cluster launcher's job, the run's last
#: committed checkpoint and the command that resumes from it, ``(None,
#: None)`` when none is committed.
Recovery = Callable[[bool], tuple[int | None, str | None]]


def timeout_problem(value: float) -> str | None:
    """What is wrong with ``value`` as ``train.peer_timeout_s``, if anything."""
    if MIN_PEER_TIMEOUT_S <= value <= MAX_PEER_TIMEOUT_S:
        return None
    return (
        f"peer_timeout_s must be in {MIN_PEER_TIMEOUT_S:g}..={MAX_PEER_TIMEOUT_S:g} seconds, "
        f"got {value!r} (a rank silent this long is declared lost; below "
        f"{MIN_PEER_TIMEOUT_S:g} s a loaded host's late heartbeat would stop a healthy job)"
    )


def check_timeout(value: float) -> float:
    """``value`` if it is a usable peer timeout, else a ``ConfigError``
    carrying the key ``train.peer_timeout_s``."""
    problem = timeout_problem(value)
    if problem is not None:
        err = ConfigError(f"`train.peer_timeout_s`: {problem}")
        err.key, err.value, err.what = "train.peer_timeout_s", json.dumps(value), problem
        raise err
    return value


def beat_interval(timeout_s: float) -> float:
    """Seconds between heartbeats: six per timeout, at least 0.2 s, at most 5 s."""
    return min(max(timeout_s / 6.0, 0.2), 5.0)


class Channel(Protocol):
    def put(self, value: str) -> None: ...

    def read(self) -> Mapping[int, str]: ...


class KvChannel:
    """Heartbeats in ``jax.distributed``'s key-value store (the coordination
    service on process 0). Its calls release the GIL; one to a stopped or
    dead service may block or fail, which the judge thread sees as silence."""

    def __init__(self, client: Any, rank: int) -> None:
        self.client, self.key = client, f"{KEY_PREFIX}{rank}"

    @classmethod
    def of_job(cls, rank: int) -> KvChannel:
        from jax._src import distributed

        client = distributed.global_state.client
        if client is None:
            raise RuntimeError("the watchdog needs jax.distributed to be initialised")
        return cls(client, rank)

    def put(self, value: str) -> None:
        self.client.key_value_set(self.key, value, allow_overwrite=True)

    def read(self) -> dict[int, str]:
        out = {}
        for key, value in self.client.key_value_dir_get(KEY_PREFIX):
            tail = str(key).rstrip("/").rpartition("/")[2]
            if tail.isdigit():
                out[int(tail)] = str(value)
        return out


@dataclasses.dataclass(frozen=True)
class Lost:
    """A peer the judge gave up on: its ``rank``, ``how`` it was found, and
    the step its last heartbeat named (None: no heartbeat seen)."""

    rank: int
    how: str
    peer_step: int | None


def _parse(value: str) -> tuple[str, int | None, str]:
    """``(state, step, detail)`` of a heartbeat value ``"<seq> <state> <step> [detail]"``."""
    parts = value.split(" ", 3)
    step = int(parts[2]) if len(parts) > 2 and parts[2].lstrip("-").isdigit() else None
    return (parts[1] if len(parts) > 1 else "?"), step, (parts[3] if len(parts) > 3 else "")


class Watchdog:
    """One rank's watch over its peers (see the module docstring)."""

    def __init__(
        self,
        rank: int,
        world: int,
        timeout_s: float,
        channel: Channel,
        *,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], Any] = os._exit,
        joined: bool = False,
    ) -> None:
        self.rank, self.world, self.timeout_s = rank, world, check_timeout(timeout_s)
        self.channel, self.clock, self._exit, self.joined = channel, clock, exit, joined
        self.interval = beat_interval(timeout_s)
        #: The step this rank is running (``metrics.jsonl`` numbering).
        self.step = 0
        self.run_dir: Path | None = None
        #: The run's last checkpoint and how to resume from it (:data:`Recovery`).
        self.recovery: Recovery | None = None
        self.wandb: Any = None
        self._state, self._detail, self._seq = "run", "", 0
        self._lock = threading.Lock()
        self._started = self._last_ok = clock()
        #: Per peer: its last heartbeat value and when (our clock) it changed.
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._fired = threading.Event()
        self._threads: list[threading.Thread] = []
        #: The collective error the main thread hit, if any (see :func:`on_error`).
        self.collective_error: str | None = None
        #: The last error :func:`on_error` was given (each is handled once).
        self.handled: BaseException | None = None
        #: This rank is failing with its own error: it reports that, not a peer.
        self.quiet = False

    # -- the beat thread --------------------------------------------------

    def beat(self) -> bool:
        """Write this rank's heartbeat and read everyone's; False if the
        store did not answer (silence, as far as the judge is concerned)."""
        with self._lock:
            self._seq += 1
            value = f"{self._seq} {self._state} {self.step}"
            if self._detail:
                value += " " + self._detail
        try:
            self.channel.put(value)
            got = self.channel.read()
        except Exception:  # a store that fails is a silent one
            return False
        now = self.clock()
        with self._lock:
            self._last_ok = now
            for r, v in got.items():
                if r != self.rank and (r not in self._seen or self._seen[r][0] != v):
                    self._seen[r] = (v, now)
        return True

    def _beat_loop(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self.interval)

    # -- the judge thread ---------------------------------------------------

    def lost(self) -> Lost | None:
        """The first peer given up on, if any (never blocks)."""
        now = self.clock()
        with self._lock:
            seen, last_ok = dict(self._seen), self._last_ok
        for r, (v, _) in sorted(seen.items()):
            state, step, detail = _parse(v)
            if state == "failed":
                return Lost(r, f"it failed: {detail or 'an error'}", step)
        if self.rank != 0 and now - last_ok > self.timeout_s:
            state0 = _parse(seen[0][0])[0] if 0 in seen else "run"
            if state0 != "done":
                return Lost(
                    0,
                    f"the job's key-value store, served by process 0, has not answered for "
                    f"{now - last_ok:.1f} s",
                    _parse(seen[0][0])[1] if 0 in seen else None,
                )
        for r in range(self.world):
            if r == self.rank:
                continue
            v, changed = seen.get(r, ("", self._started))
            state, step, _ = _parse(v) if v else ("", None, "")
            # Silence counts only while the store answers (see the module docstring).
            silent = last_ok - changed
            if state != "done" and silent > self.timeout_s:
                what = "sent no heartbeat" if not v else "sent no new heartbeat"
                return Lost(r, f"it {what} for {silent:.1f} s", step)
        return None

    def _judge_loop(self) -> None:
        period = min(self.interval, 0.5)
        while not self._stop.wait(period):
            found = self.lost()
            if found is not None:
                self.fire(found)
                return

    # -- the way out ------------------------------------------------------

    def incident(self, lost: Lost) -> dict[str, Any]:
        """What :meth:`fire` prints, writes and logs."""
        checkpoint, resume = (None, None) if self.recovery is None else self.recovery(self.joined)
        return {
            "lost_rank": lost.rank,
            "how": lost.how,
            "lost_rank_step": lost.peer_step,
            "rank": self.rank,
            "step": self.step,
            "world": self.world,
            "peer_timeout_s": self.timeout_s,
            "collective_error": self.collective_error,
            "checkpoint": checkpoint,
            "resume": resume,
            "exit_status": EXIT_PEER_LOST,
        }

    def message(self, rec: Mapping[str, Any]) -> str:
        peer = (
            ""
            if rec["lost_rank_step"] is None
            else f", its last heartbeat at step {rec['lost_rank_step']}"
        )
        text = (
            f"headwater train: rank {rec['lost_rank']} lost at step {rec['step']} "
            f"({rec['how']}{peer}); rank {self.rank} stops with exit status {EXIT_PEER_LOST}."
        )
        if rec["collective_error"]:
            text += f" The collective it was in failed with: {rec['collective_error']}."
        if rec["checkpoint"] is not None:
            text += (
                f" The last committed checkpoint is step {rec['checkpoint']} (a checkpoint "
                f"needs every rank, so none is taken now); resume with: {rec['resume']}"
            )
        else:
            text += " No checkpoint was committed before: the run must start again."
        return text

    def fire(self, lost: Lost) -> None:
        """Report ``lost`` (stderr, ``watchdog-rank<r>.json``, W&B) and end the process."""
        if self._fired.is_set() or self.quiet:
            return
        self._fired.set()
        rec = self.incident(lost)
        with contextlib.suppress(OSError, ValueError):
            print(self.message(rec), file=sys.stderr, flush=True)
        if self.run_dir is not None:
            try:
                path = self.run_dir / f"watchdog-rank{self.rank}.json"
                path.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
            except OSError as e:
                print(f"headwater train: could not write {path}: {e}", file=sys.stderr, flush=True)
        if self.wandb is not None:
            self._log_wandb(rec)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        self._exit(EXIT_PEER_LOST)

    def _log_wandb(self, rec: Mapping[str, Any]) -> None:
        run = self.wandb

        def log() -> None:
            run.summary.update(
                {
                    "trainer/lost_rank": rec["lost_rank"],
                    "trainer/lost_at_step": rec["step"],
                    "trainer/lost_reason": rec["how"],
                }
            )
            run.finish(exit_code=EXIT_PEER_LOST)

        t = threading.Thread(target=_quietly(log), name="watchdog-wandb", daemon=True)
        t.start()
        t.join(WANDB_WAIT_S)

    # -- life cycle ---------------------------------------------------------

    def start(self) -> Watchdog:
        for name, target in (("beat", self._beat_loop), ("judge", self._judge_loop)):
            t = threading.Thread(target=target, name=f"headwater-watchdog-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def set_state(self, state: str, detail: str = "") -> None:
        """``done`` / ``failed``: written at once (bounded by one beat)."""
        with self._lock:
            self._state, self._detail = state, " ".join(detail.split())[:300]
        t = threading.Thread(target=self.beat, name="headwater-watchdog-last", daemon=True)
        t.start()
        t.join(max(self.interval, 1.0))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(0.5)

    def wait_for_verdict(self) -> None:
        """Block until the judge fires (it ends the process) or the time it
        needs to name a silent peer has passed."""
        deadline = time.monotonic() + self.timeout_s + 2 * self.interval + 1.0
        # Once fired, the judge ends the process after its W&B record.
        while time.monotonic() < deadline + (WANDB_WAIT_S + 5 if self._fired.is_set() else 0):
            time.sleep(0.05)


def _quietly(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception as e:  # the run is ending anyway
            print(f"headwater train: W&B did not take the watchdog's record: {e}", file=sys.stderr)

    return run


# ----------------------------------------------------------------------------
# The process's watchdog
# ----------------------------------------------------------------------------

_CURRENT: Watchdog | None = None


def start(rank: int, world: int, timeout_s: float, *, joined: bool = False) -> Watchdog | None:
    """Start this process's watchdog (a multi-process job only; once)."""
    global _CURRENT
    if world > 1 and _CURRENT is None:
        _CURRENT = Watchdog(rank, world, timeout_s, KvChannel.of_job(rank), joined=joined).start()
    return _CURRENT


def current() -> Watchdog | None:
    return _CURRENT


def attach(run_dir: Path, wandb_run: Any, step: int, recovery: Recovery | None = None) -> None:
    """Where the incident is written and logged, the first step, and how the
    run says it can be resumed."""
    if _CURRENT is not None:
        _CURRENT.run_dir, _CURRENT.wandb, _CURRENT.step = run_dir, wandb_run, step
        _CURRENT.recovery = recovery


def at_step(step: int) -> None:
    """The step loop's mark: ``step`` is running."""
    if _CURRENT is not None:
        _CURRENT.step = step


def finish() -> None:
    """This rank's run ended: the peers stop watching it (it keeps watching
    them through the shutdown barrier; :func:`stop` after it)."""
    if _CURRENT is not None:
        _CURRENT.set_state("done")


def stop() -> None:
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.stop()
        _CURRENT = None


#: Words of a collective that failed because a peer went away: gloo's
#: ``Connection reset by peer`` / ``Connection closed by peer`` (orbax
#: re-raises it as a ``ValueError``), NCCL's remote errors.
_PEER_WORDS = ("gloo", "nccl", "connection reset by peer", "connection closed by peer")


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) looks like a
    collective that failed on a lost peer."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        text = str(seen).lower()
        if any(w in text for w in _PEER_WORDS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def on_error(exc: BaseException) -> None:
    """The main thread's error: a collective that failed on a lost peer
    waits for the judge to name it (which ends the process); any other is
    written as ``failed`` for the peers, and returned to the caller."""
    dog = _CURRENT
    if dog is None or dog.handled is exc:
        return
    dog.handled = exc
    if dog._fired.is_set():
        dog.wait_for_verdict()
        return
    if is_collective_failure(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        dog.collective_error = f"{type(exc).__name__}: {first[:300]}"
        print(
            f"headwater train: rank {dog.rank}: a collective failed ({dog.collective_error}); "
            f"waiting up to {dog.timeout_s:g} s for the watchdog to name the rank that stopped",
            file=sys.stderr,
            flush=True,
        )
        dog.wait_for_verdict()
        return
    if not isinstance(exc, KeyboardInterrupt | SystemExit):
        # This rank's own error is what it reports (the peers it stops may
        # write theirs): its judge stands down.
        dog.quiet = True
        dog.set_state("failed", f"{type(exc).__name__}: {exc}")
