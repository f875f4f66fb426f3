"""Sinks for the reduced step telemetry: the Weights & Biases sink.

``WandbSink(run)`` logs every reduced dict (:mod:`headwater.telemetry`) on
rank 0 only, under ``sampler/...`` against the step metric ``trainer/step``,
and declares each key with ``define_metric`` so the run summary keeps the
value that matters for the key's kind:

==================================  =========  ====================================
keys                                summary    why
==================================  =========  ====================================
MIN keys (``pool/remaining_min``,   ``min``    the closest the cluster came to an
``queue/depth_min``, ...)                      empty pool / an empty prefetch queue
MAX keys (``mix/tv_distance``,      ``max``    the worst drift / starvation seen
``pool/steps_since_pick_max``, ...)
SUM counters (``pool/exhaust_       ``max``    counters are per-step deltas: the
events``, ``truncation/...``,                  peak step is the incident (a spike
``queue/wait_seconds``,                        of reshuffles, cuts or waiting); for
``invariants/*``, ``batches``)                 ``invariants/*`` a max > 0 says the
                                               invariant broke at least once. W&B
                                               has no ``sum`` summary; the run
                                               total is the history's sum.
``tasks/<task>``                    ``mean``   the realised task mix (seeds per
                                               step) over the run
``<counter>_max`` (worst rank)      ``max``    the worst single rank ever
``*_argmin_rank`` /                 ``last``   a rank id has no order; the latest
``*_argmax_rank``                              culprit is the one to look at
histogram ``_p50`` / ``_p95`` /     ``max``    the worst step's latency / depth /
``_max``                                       padding
histogram ``/bucket_NN``            ``none``,  the raw merged buckets, kept in the
                                    hidden     history to re-derive percentiles;
                                               not worth a chart each
==================================  =========  ====================================

On every process other than 0 (``jax.process_index() != 0``) the sink is a
no-op: it never touches ``run`` (pass ``None`` there). Works with offline
runs (``wandb.init(mode="offline", dir=...)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from headwater.telemetry.collective import process_index
from headwater.telemetry.schema import PREFIX, Schema

__all__ = ["STEP_METRIC", "WandbSink", "summary_for"]

STEP_METRIC = "trainer/step"

_SUMMARY = {
    "MIN": "min",
    "MAX": "max",
    "SUM": "max",
    "SUM_MAX": "max",
    "RANK": "last",
    "QUANTILE": "max",
    "HIST_MAX": "max",
    "BUCKET": "none",
}


def _kind_from_name(key: str) -> str:
    """The reduced-key kind from the name alone (no schema bound)."""
    if key.endswith(("_argmin_rank", "_argmax_rank")):
        return "RANK"
    if "/bucket_" in key:
        return "BUCKET"
    if key.endswith(("_p50", "_p95")):
        return "QUANTILE"
    if key.endswith("_min"):
        return "MIN"
    if key.endswith("_max"):
        return "MAX"
    return "SUM"


def summary_for(key: str, kind: str | None = None) -> str:
    """The ``define_metric`` summary of a reduced key (see the module table)."""
    kind = kind or _kind_from_name(key)
    if kind == "SUM" and key.startswith(PREFIX + "tasks/"):
        return "mean"
    return _SUMMARY[kind]


class WandbSink:
    """Log reduced telemetry dicts to a W&B run on rank 0.

    ``run``: a ``wandb`` run (default: ``wandb.run`` on rank 0).
    ``schema``: optional :class:`~headwater.telemetry.Schema` (or sampler /
    schema list) for the key kinds; :class:`~headwater.telemetry.StepHook`
    binds its own. Without one, kinds are read from the key names.
    ``rank``: override the process index (default ``jax.process_index()``
    when JAX is in use, else 0).
    """

    def __init__(
        self,
        run: Any = None,
        *,
        schema: Any = None,
        step_metric: str = STEP_METRIC,
        rank: int | None = None,
    ) -> None:
        self.rank = process_index() if rank is None else rank
        self.step_metric = step_metric
        self.schema: Schema | None = None if schema is None else Schema.of(schema)
        self._defined: set[str] = set()
        self._base_defined = False
        self.run: Any = None
        if self.active:
            if run is None:
                run = importlib.import_module("wandb").run
                if run is None:
                    raise RuntimeError("WandbSink: no run given and wandb.init() was not called")
            self.run = run

    @property
    def active(self) -> bool:
        """Whether this process logs (rank 0)."""
        return self.rank == 0

    def bind(self, schema: Any) -> None:
        """Use ``schema``'s key kinds and declare every key now."""
        self.schema = Schema.of(schema)
        if self.active:
            self._define(self.schema.reduced_keys)

    def _kind(self, key: str) -> str | None:
        return None if self.schema is None else self.schema.reduced_kinds.get(key)

    def _define(self, keys: Any) -> None:
        run = self.run
        if not self._base_defined:
            run.define_metric(self.step_metric)
            run.define_metric(PREFIX + "*", step_metric=self.step_metric)
            self._base_defined = True
        for key in keys:
            if key in self._defined:
                continue
            kind = self._kind(key) or _kind_from_name(key)
            run.define_metric(
                key,
                step_metric=self.step_metric,
                summary=summary_for(key, kind),
                hidden=True if kind == "BUCKET" else None,
            )
            self._defined.add(key)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log one reduced dict against ``step`` (no-op off rank 0 or when empty)."""
        if not self.active or not metrics:
            return
        row = {(k if k.startswith(PREFIX) else PREFIX + k): float(v) for k, v in metrics.items()}
        new = [k for k in row if k not in self._defined]
        if new:
            self._define(new)
        row[self.step_metric] = int(step)
        self.run.log(row)

    def close(self) -> None:
        """Nothing to release: the caller owns the run (``run.finish()``)."""
