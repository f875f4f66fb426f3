"""The sampler-health signals of ``headwater diag`` and their healthy bands.

Owns: :class:`Signal` (a name, the reduced telemetry key it reads, the
statistic taken over a run's steps, what that statistic is in words, its
unit, its healthy band and, for cross-rank signals, the ``_arg*_rank``
sibling naming the culprit) and :data:`SIGNALS`.

Every statistic is defined together with its *trace*: the same quantity over
the steps (a running share, a running total, a running ratio, or the
per-step values whose median or maximum is taken), so a plot of the trace
shows exactly the number the verdict judges.

Must never: read a key that is not in the reduced telemetry, or skip a task
(every task of the database is traced, whatever its name).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from headwater.telemetry import PREFIX as P

INF = math.inf
Rows = list[dict[str, float]]
Ctx = Mapping[str, Any]
#: ``(statistic, traces)``: traces are label → values, one per row.
Measure = Callable[[Rows, Ctx], tuple[float, dict[str, np.ndarray]]]


@dataclasses.dataclass(frozen=True)
class Signal:
    """One health signal: its statistic must stay inside ``healthy``."""

    name: str
    key: str  # the reduced key it reads
    measure: Measure
    healthy: tuple[float, float]
    what: str  # the statistic, in words
    unit: str  # the statistic's unit (axis label)
    culprit_key: str | None = None  # the _arg*_rank sibling naming the culprit
    #: A counter: its culprit is read only at steps where it counted something
    #: (at a step where every rank has 0, the tie names rank 0).
    counter: bool = False
    #: The trace is per-step values (the statistic is their median / max),
    #: not a running statistic that ends at the value.
    per_step: bool = False
    #: Only the second half of the judged steps counts (a windowed metric).
    late: bool = False

    def stat(self, rows: Rows, ctx: Ctx) -> float:
        return self.measure(rows, ctx)[0]

    def traces(self, rows: Rows, ctx: Ctx) -> dict[str, np.ndarray]:
        return self.measure(rows, ctx)[1]


def series(rows: Rows, key: str) -> np.ndarray:
    """``key`` per row (NaN where a row lacks it)."""
    return np.array([r.get(key, math.nan) for r in rows], dtype=float)


def _running_mean(x: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(x)
    n = np.cumsum(ok)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.cumsum(np.where(ok, x, 0.0)) / np.maximum(n, 1), np.nan)


def _running_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    ok = ~(np.isnan(num) | np.isnan(den))
    a, b = np.cumsum(np.where(ok, num, 0.0)), np.cumsum(np.where(ok, den, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


def _last(x: np.ndarray) -> float:
    return float(x[-1]) if x.size else math.nan


def share(key: str, positive: bool, label: str) -> Measure:
    """The share of steps where ``key`` is > 0 (``positive``) or <= 0."""

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        x = series(rows, key)
        hit = np.where(np.isnan(x), np.nan, ((x > 0) == positive).astype(float))
        run = _running_mean(hit)
        return _last(run), {label: run}

    return f


def median(key: str, label: str, late: bool = False) -> Measure:
    """The median of ``key`` per step (``late``: over the second half only)."""

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        x = series(rows, key)
        judged = x[len(x) // 2 :] if late else x
        judged = judged[~np.isnan(judged)]
        return (float(np.median(judged)) if judged.size else math.nan), {label: x}

    return f


def maximum(key: str, label: str) -> Measure:
    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        x = series(rows, key)
        return (float(np.nanmax(x)) if np.any(~np.isnan(x)) else math.nan), {label: x}

    return f


def total(key: str, label: str) -> Measure:
    """The run total of a counter (traced as the running total)."""

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        run = np.cumsum(np.nan_to_num(series(rows, key)))
        return (_last(run) if run.size else 0.0), {label: run}

    return f


def task_shares(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
    """Each task's running share of drawn seeds; the statistic is the
    smallest final share among tasks with a configured weight > 0."""
    weights: Mapping[str, float] = ctx["task_weights"]
    drawn = {t: np.cumsum(np.nan_to_num(series(rows, f"{P}tasks/{t}"))) for t in weights}
    all_drawn = np.sum(list(drawn.values()), axis=0) if drawn else np.zeros(len(rows))
    with np.errstate(invalid="ignore", divide="ignore"):
        traces = {
            t: np.where(all_drawn > 0, d / np.maximum(all_drawn, 1e-300), np.nan)
            for t, d in drawn.items()
        }
    weighted = [t for t, w in weights.items() if w > 0]
    finals = [_last(traces[t]) for t in weighted]
    value = min(finals) if finals and not any(math.isnan(v) for v in finals) else math.nan
    return value, traces


def truncated_share(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
    """Cells dropped by the budget per cell of budget (dropped / (batches · S))."""
    dropped = series(rows, f"{P}truncation/cells_dropped")
    budget = series(rows, f"{P}batches") * ctx["sequence_length"]
    run = _running_ratio(dropped, budget)
    return _last(run), {"dropped / budget (running)": run}


def remaining_spread(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
    """remaining_min / remaining_max per step (smallest pool left vs largest);
    the statistic is its median."""
    lo, hi = series(rows, f"{P}pool/remaining_min"), series(rows, f"{P}pool/remaining_max")
    ratio = lo / np.maximum(hi, 1.0)
    ok = ratio[~np.isnan(ratio)]
    return (float(np.median(ok)) if ok.size else math.nan), {"min / max per step": ratio}


def data_wait_share(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
    """Seconds the ranks blocked on the queue over rank-seconds of training."""
    wait = series(rows, f"{P}queue/wait_seconds")
    step = series(rows, "trainer/step_seconds") * ctx["processes"]
    run = _running_ratio(wait, step)
    return _last(run), {"wait / rank time (running)": run}


def verdict_share(code: int, label: str) -> Measure:
    """The share of steps the trainer's live verdict (``trainer/verdict``,
    the index in :data:`headwater.train.verdict.VERDICTS`) was ``code``."""

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        x = series(rows, "trainer/verdict")
        hit = np.where(np.isnan(x), np.nan, (x == code).astype(float))
        run = _running_mean(hit)
        return _last(run), {label: run}

    return f


#: Every signal, in table order (data, not logic: one entry per signal).
_TABLE: tuple[Signal, ...] = (
    Signal(
        "pool/exhaust_events",
        f"{P}pool/exhaust_events",
        share(f"{P}pool/exhaust_events", True, "share of steps so far"),
        (0.0, 0.2),
        "share of steps in which some pool was exhausted",
        "share of steps",
        f"{P}pool/exhaust_events_argmax_rank",
        counter=True,
    ),
    Signal(
        "pool/steps_to_exhaust_min",
        f"{P}pool/steps_to_exhaust_min",
        median(f"{P}pool/steps_to_exhaust_min", "forecast per step"),
        (25.0, INF),
        "median forecast of batches until the next pool exhaustion",
        "batches",
        f"{P}pool/steps_to_exhaust_min_argmin_rank",
        per_step=True,
    ),
    Signal(
        "pool/remaining_min",
        f"{P}pool/remaining_min",
        remaining_spread,
        (0.02, INF),
        "median ratio of the emptiest to the fullest pool's remaining seeds",
        "remaining_min / remaining_max",
        f"{P}pool/remaining_min_argmin_rank",
        per_step=True,
    ),
    Signal(
        "tasks/min_share",
        f"{P}tasks/",
        task_shares,
        (0.05, 1.0),
        "smallest share of drawn seeds among the weighted tasks",
        "share of drawn seeds",
    ),
    Signal(
        "pool/steps_since_pick_max",
        f"{P}pool/steps_since_pick_max",
        maximum(f"{P}pool/steps_since_pick_max", "per step"),
        (0.0, 60.0),
        "longest wait, in batches, of a weighted task since it was last picked",
        "batches",
        f"{P}pool/steps_since_pick_max_argmax_rank",
        per_step=True,
    ),
    Signal(
        "databases/steps_since_pick_max",
        f"{P}databases/steps_since_pick_max",
        maximum(f"{P}databases/steps_since_pick_max", "per step"),
        (0.0, 30.0),
        "longest wait, in batches, of a database with weight > 0 since it was last picked "
        "(a mixture's starved database; 0 for one database)",
        "batches",
        per_step=True,
    ),
    Signal(
        "mix/tv_distance",
        f"{P}mix/tv_distance",
        median(f"{P}mix/tv_distance", "per step", late=True),
        (0.0, 0.25),
        "median total-variation distance between the drawn and the configured task mix "
        "(second half of the run)",
        "TV distance",
        per_step=True,
        late=True,
    ),
    Signal(
        "truncation/cells_dropped",
        f"{P}truncation/cells_dropped",
        truncated_share,
        (0.0, 2.0),
        "cells cut by the sequence budget per cell of budget",
        "dropped cells / budget cells",
    ),
    Signal(
        "padding/fraction_p50",
        f"{P}padding/fraction_p50",
        median(f"{P}padding/fraction_p50", "batch p50 per step"),
        (0.05, 0.85),
        "median share of padding cells in a sequence",
        "share of cells",
        per_step=True,
    ),
    Signal(
        "packing/segments_per_sequence_p50",
        f"{P}packing/segments_per_sequence_p50",
        median(f"{P}packing/segments_per_sequence_p50", "batch p50 per step"),
        (1.0, 1.0),
        "median seeds' contexts per sequence (above 1: packing is on, padding should be low)",
        "segments",
        per_step=True,
    ),
    Signal(
        "queue/depth_min",
        f"{P}queue/depth_min",
        share(f"{P}queue/depth_min", False, "share of steps so far"),
        (0.0, 0.2),
        "share of steps that found the batch queue empty",
        "share of steps",
        f"{P}queue/depth_min_argmin_rank",
    ),
    Signal(
        "queue/wait_seconds",
        f"{P}queue/wait_seconds",
        data_wait_share,
        (0.0, 0.05),
        "share of the ranks' training time spent waiting for a batch",
        "share of time",
        f"{P}queue/wait_seconds_argmax_rank",
        counter=True,
    ),
    Signal(
        "verdict/input_bound",
        "trainer/verdict",
        verdict_share(1, "share of steps so far"),
        (0.0, 0.5),  # a loaded CPU makes some healthy steps wait: half the run
        "share of steps the trainer judged input_bound (the wait spread over the ranks)",
        "share of steps",
    ),
    Signal(
        "verdict/input_straggler",
        "trainer/verdict",
        verdict_share(2, "share of steps so far"),
        (0.0, 0.2),
        "share of steps the trainer judged input_straggler (one rank's wait dominates)",
        "share of steps",
        "trainer/verdict_rank",
        counter=True,
    ),
    Signal(
        "stage/total_seconds_p50",
        f"{P}stage/total_seconds_p50",
        median(f"{P}stage/total_seconds_p50", "batch p50 per step"),
        (0.0, 0.05),
        "median time to make one batch",
        "seconds",
        per_step=True,
    ),
    Signal(
        "invariants/temporal_leaks",
        f"{P}invariants/temporal_leaks",
        total(f"{P}invariants/temporal_leaks", "running total"),
        (0.0, 0.0),
        "rows dated after the seed's observation time (run total)",
        "rows",
        f"{P}invariants/temporal_leaks_argmax_rank",
        counter=True,
    ),
    Signal(
        "invariants/duplicate_seeds",
        f"{P}invariants/duplicate_seeds",
        total(f"{P}invariants/duplicate_seeds", "running total"),
        (0.0, 0.0),
        "seeds drawn twice in one epoch (run total)",
        "seeds",
        f"{P}invariants/duplicate_seeds_argmax_rank",
        counter=True,
    ),
)


SIGNALS: dict[str, Signal] = {s.name: s for s in _TABLE}
