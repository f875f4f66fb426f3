"""Device-side prefetch for the training loop (``train.device_prefetch``):
a background thread owns the training stream, so the next batches' sampling
and host → device copies run while the current step computes.

Owns: :class:`Fetched` (one batch as the loop consumes it: the device
arrays, its useful cells, its telemetry drain, the sampler state right after
it, and how long the thread waited for the sampler and for the transfer),
:func:`produce` (one such batch) and :class:`Prefetcher` (the thread and its
bounded queue).

The thread is the only caller of ``next_train_batch`` while it runs, so the
batches come in stream order and none is lost or reordered: the loop gets
exactly the batches it would have fetched itself. It drains the batch's
telemetry and takes ``state_dict()`` right after each batch, so the loop
logs each step's own drain and checkpoints the stream state after the
batches it actually consumed (:func:`consumed_state`), never after the ones
still queued. With one process the thread also pads the batch and copies it
to the device, waiting until it is there (the transfer time, measured off
the loop's path). With several processes the padding needs a shape
agreement, a cross-process collective that must stay in step with the
train step's own collectives on the main thread: the thread then prefetches
host batches only and the loop pads and copies them.

An exception in the thread reaches the loop at its next :meth:`Prefetcher.get`
(the same exception object, its message intact). :meth:`Prefetcher.close`
stops the thread (it drops whatever is queued) and joins it.

Must never: reorder, drop or duplicate a consumed batch; let a checkpoint
hold a stream state past the consumed batches; call the sampler's train
stream from two threads.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: How long a blocked put or get sleeps before checking for close/death.
POLL_S = 0.05


@dataclasses.dataclass
class Fetched:
    """One training batch as the loop consumes it."""

    #: The global device arrays (``None``: not placed yet, see :func:`produce`).
    batch: Any
    #: The sampler's batch (or one per local stream), kept until placed.
    raw: Any
    #: Useful (non-padding) cells of the batch.
    useful: int
    #: ``drain_step_metrics_packed()`` right after the batch (its telemetry).
    drain: Any
    #: ``state_dict()`` right after the batch.
    state: dict[str, Any]
    #: Seconds blocked in ``next_train_batch``.
    sample_s: float
    #: Seconds padding and copying to the device (until the copy was done).
    put_s: float
    #: The stop request agreed with the batch's shapes (0: none).
    flag: int
    #: Seconds of all the thread's work on the batch after the sampler
    #: returned it (drain, state, padding, copy): the tail the loop may wait for.
    work_s: float = 0.0
    #: The local batch's ``(B, S)`` (of one stream: see :func:`local_shape`).
    shape: tuple[int, int] = (0, 0)


def useful_cells(np_batch: Any) -> int:
    parts = np_batch if isinstance(np_batch, list) else [np_batch]
    return sum(int(b["is_padding"].size - np.count_nonzero(b["is_padding"])) for b in parts)


def local_shape(np_batch: Any) -> tuple[int, int]:
    """``(B, S)`` of the sampler's batch (of its first stream, when a rank
    reads one per local device group: every stream has the same shape)."""
    first = np_batch[0] if isinstance(np_batch, list) else np_batch
    b, s = first["is_padding"].shape
    return int(b), int(s)


def produce(
    sampler: Any,
    place: Callable[[Any], tuple[Any, int]] | None,
    split: str,
    drainer: Any = None,
) -> Fetched:
    """The next training batch, its drain (from ``drainer``, default the
    sampler: the run's drain recorder wraps it) and the state after it;
    placed on the device by ``place`` (``raw -> (device batch, agreed
    flag)``, waited for) when given."""
    import jax

    t0 = time.perf_counter()
    raw = sampler.next_train_batch()
    t1 = time.perf_counter()
    drain = (drainer or sampler).drain_step_metrics_packed(split)
    state = sampler.state_dict()
    useful, shape = useful_cells(raw), local_shape(raw)
    batch, flag, t2 = None, 0, time.perf_counter()
    if place is not None:
        batch, flag = place(raw)
        jax.block_until_ready(batch)
        raw = None
    t3 = time.perf_counter()
    return Fetched(batch, raw, useful, drain, state, t1 - t0, t3 - t2, flag, t3 - t1, shape)


def consumed_state(live: dict[str, Any], consumed: dict[str, Any]) -> dict[str, Any]:
    """The sampler state to checkpoint: ``live`` (every split as of now: the
    val stream the loop drew from) with the train split of ``consumed`` (the
    state right after the last batch the loop stepped on)."""
    splits = dict(live.get("splits", {}))
    splits["train"] = consumed["splits"]["train"]
    return {**live, "splits": splits}


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Prefetcher:
    """Runs ``make()`` on a daemon thread, up to ``depth`` results ahead of
    :meth:`get`, at most ``limit`` times (the run's steps: no batch is drawn
    that no step will take); stops producing after a result with a stop
    flag (every rank stops at the same batch: the flag was agreed with its
    shapes)."""

    def __init__(
        self,
        make: Callable[[], Fetched],
        depth: int,
        limit: int | None = None,
        name: str = "hw-prefetch",
    ) -> None:
        if depth < 1:
            raise ValueError(f"device_prefetch depth must be >= 1, got {depth}")
        self._make, self.depth, self.limit = make, depth, limit
        #: The loop's stop flag (``signum``), when the loop places the batches.
        self.stop: Any = None
        self._q: queue.Queue[Fetched | _Failed] = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        #: Batches handed to the loop, and the thread's seconds per batch.
        self.taken = 0
        self.sample_s = 0.0
        self.put_s = 0.0
        self._thread.start()

    def _put(self, item: Fetched | _Failed) -> bool:
        while not self._closed.is_set():
            try:
                self._q.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            made = 0
            while not self._closed.is_set() and (self.limit is None or made < self.limit):
                item, made = self._make(), made + 1
                if not self._put(item) or item.flag:
                    return
        except BaseException as e:  # handed to the loop's thread
            self._put(_Failed(e))

    def get(self) -> tuple[Fetched, float]:
        """The next batch and the seconds this call waited for it; the
        thread's exception, if it failed."""
        t0 = time.perf_counter()
        while True:
            try:
                item = self._q.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    raise RuntimeError(
                        "the device prefetch thread ended without a batch "
                        "(it stops after a batch that carried a stop request)"
                    ) from None
        if isinstance(item, _Failed):
            self.close()
            raise item.exc
        self.taken += 1
        self.sample_s += item.sample_s
        self.put_s += item.put_s
        return item, time.perf_counter() - t0

    @classmethod
    def for_loop(cls, trainer: Any) -> Prefetcher:
        """The thread of a :class:`~headwater.train.loop.Trainer`:
        ``train.device_prefetch`` deep, for the steps left in this attempt
        (no batch beyond them), drained through its hook's sampler (the drain
        recorder, if any); with one process it also pads (its own padder: the
        loop pads validation batches meanwhile) and copies to the device."""
        from headwater.evaluation.padder import Padder

        sampler, mesh, stop, hook = trainer.sampler, trainer.mesh, trainer.stop, trainer.hook
        train = trainer.cfg.train
        pad = Padder(mesh, trainer.model_cfg.max_categories)

        def place(raw: Any) -> tuple[Any, int]:
            return pad(raw, flag=stop.signum), pad.flag

        one, split, drainer = mesh.world == 1, hook.split, hook.sampler
        feed = cls(
            lambda: produce(sampler, place if one else None, split, drainer),
            train.device_prefetch,
            limit=train.steps - trainer.start_step,
        )
        feed.stop = stop
        return feed

    def take(self, pad: Any, profile: bool) -> tuple[Fetched, float, float]:
        """:meth:`get`, the batch placed on the device with ``pad`` (the loop's
        padder) if the thread did not: ``(batch, sample wait s, host→device s)``.
        The loop's wait is the tail of the thread's work on the batch, split
        into its sampler wait (at most the thread's own) and the rest (the
        thread's padding, copy and bookkeeping, or the thread not running)."""
        import jax

        item, waited = self.get()
        put = waited - min(max(waited - item.work_s, 0.0), item.sample_s)
        if item.batch is None:  # several processes: placed here (module doc)
            t0 = time.perf_counter()
            item.batch = pad(item.raw, flag=self.stop.signum if self.stop is not None else 0)
            item.flag, item.raw = pad.flag, None
            if profile:
                jax.block_until_ready(item.batch)
            put = time.perf_counter() - t0
            waited += put
        return item, waited - put, put

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread (dropping queued batches) and join it."""
        self._closed.set()
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def stats(self) -> dict[str, float]:
        """The thread's mean seconds per consumed batch (off the loop's path)."""
        n = max(self.taken, 1)
        return {
            "depth": float(self.depth),
            "batches": float(self.taken),
            "sample_seconds_mean": self.sample_s / n,
            "host_to_device_seconds_mean": self.put_s / n,
        }
