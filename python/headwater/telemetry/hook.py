"""The step hook: drain → reduce → log to sinks, once per train step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Self, runtime_checkable

from headwater.telemetry.collective import _Pending, _start
from headwater.telemetry.schema import Schema

__all__ = ["Sink", "StepHook"]

# ---------------------------------------------------------------------------
# Hook
# ---------------------------------------------------------------------------


@runtime_checkable
class Sink(Protocol):
    """Where a :class:`StepHook` sends reduced dicts (e.g.
    :class:`headwater.telemetry.WandbSink`). Optional methods: ``bind(schema)``
    (called once with the :class:`Schema`) and ``close()``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...


class StepHook:
    """Drain, reduce and log the sampler's step telemetry once per train step.

    ``hook.step(step)`` drains ``split`` (packed), reduces it across processes
    (:func:`reduce`; a collective, so call it on every process, every step),
    logs the reduced dict to every sink against ``step`` (skipped when no rank
    reported) and returns it.

    ``buffered=True``: ``step(t)`` dispatches step ``t``'s collective without
    waiting for it (JAX dispatches asynchronously), then finishes step
    ``t - 1``'s -- which has had a whole train step to complete -- logs it
    against ``t - 1`` and returns it (``{}`` on the first call). On backends
    that dispatch asynchronously (GPU, TPU) the train step therefore never
    waits on the telemetry collective, and the reduction and the sinks work on
    a step that is already complete; the cost is one step of latency in the
    dashboards. (XLA:CPU runs a program this small inline at dispatch, so on
    CPU the collective is still paid inside ``step``.) Call :meth:`flush` (or
    :meth:`close`) after the last step to log the final one.
    """

    def __init__(
        self,
        sampler: Any,
        sinks: Iterable[Sink] = (),
        split: str = "train",
        buffered: bool = False,
        schema: Any = None,
    ) -> None:
        self.sampler = sampler
        self.split = split
        self.buffered = buffered
        self.schema = Schema.of(sampler if schema is None else schema)
        self.sinks = list(sinks)
        for s in self.sinks:
            bind = getattr(s, "bind", None)
            if callable(bind):
                bind(self.schema)
        self._pending: tuple[int, _Pending] | None = None

    def step(self, step: int, local: Any = None) -> dict[str, float]:
        """Reduce and log this step's drain: ``local`` when given (drained
        when its batch was fetched: ``train.device_prefetch``), else drained now."""
        if local is None:
            local = self.sampler.drain_step_metrics_packed(self.split)
        pending = _start(local, self.schema)
        if not self.buffered:
            return self._emit(step, pending)
        prev, self._pending = self._pending, (step, pending)
        return self._emit(*prev) if prev is not None else {}

    def flush(self) -> dict[str, float]:
        """Finish and log the reduction still in flight (buffered mode)."""
        prev, self._pending = self._pending, None
        return self._emit(*prev) if prev is not None else {}

    def close(self) -> None:
        self.flush()
        for s in self.sinks:
            close = getattr(s, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, step: int, pending: _Pending) -> dict[str, float]:
        reduced = pending.result()
        if reduced:
            for s in self.sinks:
                s.log(reduced, step)
        return reduced
