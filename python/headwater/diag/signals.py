"""The sampler-health signals of ``headwater diag`` and their healthy bands.

Owns: :class:`Signal` (a name, the metric-table row it reads, the statistic
taken over a run's steps and whether the ``_arg*_rank`` sibling names a
culprit) and :data:`SIGNALS`. What the statistic is in words, its unit and
its healthy band belong to the metric-table row (its ``healthy``, in Rust:
the dashboards and the metrics reference read the same band); only the
trainer's verdict, a gauge outside that table, states its bands here.

A signal names its metric once, as the key of its row in the metric table
(``_native.metric_table()``) or of a trainer gauge (``trainer_gauges()``);
the reduced key it reads (:func:`reduced`: the prefix, a histogram's
quantile suffix) and its culprit key (:func:`culprit_of`: ``_argmin_rank``
for a ``MIN`` row, ``_argmax_rank`` for ``MAX`` and ``SUM``) follow from the
row, so a key renamed in Rust cannot leave a signal reading nothing.

Every statistic is defined together with its *trace*: the same quantity over
the steps (a running share, a running total, a running ratio, or the
per-step values whose median or maximum is taken), so a plot of the trace
shows exactly the number the verdict judges.

Must never: read a key that is not in the reduced telemetry, spell a metric's
reduced or culprit key by hand, or skip a task (every task of the database
is traced, whatever its name).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from headwater import _native
from headwater.rows import MetricRow, TrainerGaugeRow
from headwater.telemetry import PREFIX as P

INF = math.inf
Rows = list[dict[str, float]]
Ctx = Mapping[str, Any]
#: ``(statistic, traces)``: traces are label → values, one per row.
Measure = Callable[[Rows, Ctx], tuple[float, dict[str, np.ndarray]]]
#: A statistic of one reduced key: the key → its :data:`Measure`.
Rule = Callable[[str], Measure]

#: The metric table (Rust) and the trainer's gauges, by key.
METRICS: dict[str, MetricRow] = {r["key"]: r for r in _native.metric_table()}
TRAINER_GAUGES: dict[str, TrainerGaugeRow] = {g["key"]: g for g in _native.trainer_gauges()}
#: The reducer's culprit sibling of each reduction (``headwater.telemetry``).
CULPRIT_SUFFIX = {"MIN": "_argmin_rank", "MAX": "_argmax_rank", "SUM": "_argmax_rank"}


def reduced(metric: str, quantile: str | None = None) -> str:
    """The reduced telemetry key of the table row ``metric``: prefixed; a
    histogram's ``quantile`` (``"p50"``, ``"p95"``) appended; a per-task
    row's ``{task}`` left off (the keys of every task start with it). A
    trainer gauge's key is logged as it is."""
    if metric in TRAINER_GAUGES:
        return metric
    row = METRICS.get(metric)
    if row is None:
        raise KeyError(f"{metric!r} is neither a metric_table() nor a trainer_gauges() row")
    if (row["reduction"] == "HISTOGRAM") != (quantile is not None):
        raise ValueError(f"{metric!r} ({row['reduction']}) read with quantile {quantile!r}")
    key = f"{P}{metric.removesuffix('{task}')}"
    return f"{key}_{quantile}" if quantile else key


def culprit_of(metric: str) -> str:
    """The key naming the rank behind the reduced value of ``metric``: the
    reducer's ``_arg*_rank`` sibling of a table row (by its reduction), a
    trainer gauge's ``<key>_rank`` gauge."""
    if metric in TRAINER_GAUGES:
        key = f"{metric}_rank"
        if key not in TRAINER_GAUGES:
            raise KeyError(f"trainer gauge {metric!r} has no {key!r} gauge")
        return key
    row = METRICS[metric]
    if row["reduction"] not in CULPRIT_SUFFIX or row["per_task"] or row["per_database"] or row["per_kind"]:
        raise ValueError(f"{metric!r} ({row['reduction']}) names no culprit rank")
    return reduced(metric) + CULPRIT_SUFFIX[row["reduction"]]


@dataclasses.dataclass(frozen=True)
class Signal:
    """One health signal: its statistic must stay inside ``healthy``."""

    metric: str  # the metric-table row (or trainer gauge) it reads
    rule: Rule  # the statistic, given the reduced key
    #: The band, the statistic in words and its unit: a metric-table row's
    #: own (its ``healthy``, stated once, in Rust); given here only for a
    #: trainer gauge, which is not a row of that table.
    healthy: tuple[float, float] | None = None
    what: str = ""
    unit: str = ""
    #: The name (default: the reduced key without the prefix).
    name: str = ""
    #: A histogram row: the quantile read (``"p50"``).
    quantile: str | None = None
    #: The row's ``_arg*_rank`` sibling names the culprit.
    culprit: bool = False
    #: A counter: its culprit is read only at steps where it counted something
    #: (at a step where every rank has 0, the tie names rank 0).
    counter: bool = False
    #: The trace is per-step values (the statistic is their median / max),
    #: not a running statistic that ends at the value.
    per_step: bool = False
    #: Only the second half of the judged steps counts (a windowed metric).
    late: bool = False

    def __post_init__(self) -> None:
        row = METRICS.get(self.metric)
        if row is not None:
            band = row["healthy"]
            if band is None:
                raise ValueError(f"metric {self.metric!r} has no healthy band in the metric table")
            if self.healthy is not None or self.what or self.unit:
                raise ValueError(
                    f"signal on {self.metric!r} restates its band: the metric table owns it"
                )
            hi = INF if band["hi"] is None else band["hi"]
            object.__setattr__(self, "healthy", (band["lo"], hi))
            object.__setattr__(self, "what", band["what"])
            object.__setattr__(self, "unit", band["unit"])
        elif self.healthy is None or not self.what or not self.unit:
            raise ValueError(f"signal on trainer gauge {self.metric!r} needs healthy, what and unit")
        if not self.name:
            object.__setattr__(self, "name", self.key.removeprefix(P))
        if self.culprit:
            culprit_of(self.metric)  # the row has one

    @property
    def band(self) -> tuple[float, float]:
        """The healthy band (the row's, or the gauge signal's own)."""
        if self.healthy is None:  # __post_init__ refuses a signal without one
            raise ValueError(f"signal {self.name!r} has no band")
        return self.healthy

    @property
    def key(self) -> str:
        """The reduced key it reads."""
        return reduced(self.metric, self.quantile)

    @property
    def culprit_key(self) -> str | None:
        """The ``_arg*_rank`` sibling naming the culprit, if it has one."""
        return culprit_of(self.metric) if self.culprit else None

    @property
    def measure(self) -> Measure:
        return self.rule(self.key)

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


def share(positive: bool, label: str) -> Rule:
    """The share of steps where the key is > 0 (``positive``) or <= 0."""

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            x = series(rows, key)
            hit = np.where(np.isnan(x), np.nan, ((x > 0) == positive).astype(float))
            run = _running_mean(hit)
            return _last(run), {label: run}

        return f

    return rule


def median(label: str, late: bool = False) -> Rule:
    """The median of the key per step (``late``: over the second half only)."""

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            x = series(rows, key)
            judged = x[len(x) // 2 :] if late else x
            judged = judged[~np.isnan(judged)]
            return (float(np.median(judged)) if judged.size else math.nan), {label: x}

        return f

    return rule


def _extreme(label: str, agg: Callable[[np.ndarray], Any]) -> Rule:
    """``agg`` (``np.nanmax``, ``np.nanmin``) of the key over the steps."""

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            x = series(rows, key)
            return (float(agg(x)) if np.any(~np.isnan(x)) else math.nan), {label: x}

        return f

    return rule


def maximum(label: str) -> Rule:
    """The largest value of the key over the steps."""
    return _extreme(label, np.nanmax)


def minimum(label: str) -> Rule:
    """The smallest value of the key over the steps."""
    return _extreme(label, np.nanmin)


def share_of_cells(label: str) -> Rule:
    """The key per step (a count of a sequence's cells) over a sequence's
    filled cells, ``S · (1 - padding/fraction_p50)``; the statistic is its
    median over the steps."""
    padding_key = reduced("padding/fraction", "p50")

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            cells = float(ctx["sequence_length"]) * (1.0 - series(rows, padding_key))
            with np.errstate(invalid="ignore", divide="ignore"):
                x = np.where(cells > 0, series(rows, key) / cells, np.nan)
            ok = x[~np.isnan(x)]
            return (float(np.median(ok)) if ok.size else math.nan), {label: x}

        return f

    return rule


def total(label: str) -> Rule:
    """The run total of a counter (traced as the running total)."""

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            run = np.cumsum(np.nan_to_num(series(rows, key)))
            return (_last(run) if run.size else 0.0), {label: run}

        return f

    return rule


def per_seed(label: str) -> Rule:
    """A counter's running total per drawn seed (the tasks' seed counts: one
    per sequence without packing)."""
    seeds = reduced("tasks/{task}")

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            per_task = [np.nan_to_num(series(rows, f"{seeds}{t}")) for t in ctx["task_weights"]]
            drawn = np.sum(per_task, axis=0) if per_task else np.zeros(len(rows))
            run = _running_ratio(np.nan_to_num(series(rows, key)), drawn)
            return (_last(run) if run.size else 0.0), {label: run}

        return f

    return rule


def task_shares(prefix: str) -> Measure:
    """Each task's running share of drawn seeds (``prefix``: the per-task
    keys' common start); the statistic is the smallest final share among
    tasks with a configured weight > 0."""

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        weights: Mapping[str, float] = ctx["task_weights"]
        drawn = {t: np.cumsum(np.nan_to_num(series(rows, f"{prefix}{t}"))) for t in weights}
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

    return f


def truncated_share(dropped_key: str) -> Measure:
    """Cells dropped by the budget per cell of budget (dropped / (batches · S))."""
    batches_key = reduced("batches")

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        dropped = series(rows, dropped_key)
        budget = series(rows, batches_key) * ctx["sequence_length"]
        run = _running_ratio(dropped, budget)
        return _last(run), {"dropped / budget (running)": run}

    return f


def remaining_spread(min_key: str) -> Measure:
    """remaining_min / remaining_max per step (smallest pool left vs largest);
    the statistic is its median."""
    max_key = reduced("pool/remaining_max")

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        lo, hi = series(rows, min_key), series(rows, max_key)
        ratio = lo / np.maximum(hi, 1.0)
        ok = ratio[~np.isnan(ratio)]
        return (float(np.median(ok)) if ok.size else math.nan), {"min / max per step": ratio}

    return f


#: The trainer's step time, as its loop logs it (not an exported gauge).
STEP_SECONDS = "trainer/step_seconds"


def data_wait_share(wait_key: str) -> Measure:
    """Seconds the ranks blocked on the queue over rank-seconds of training."""

    def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
        wait = series(rows, wait_key)
        step = series(rows, STEP_SECONDS) * ctx["processes"]
        run = _running_ratio(wait, step)
        return _last(run), {"wait / rank time (running)": run}

    return f


def verdict_share(code: int, label: str) -> Rule:
    """The share of steps the trainer's live verdict (the index in
    :data:`headwater.train.verdict.VERDICTS`) was ``code``."""

    def rule(key: str) -> Measure:
        def f(rows: Rows, ctx: Ctx) -> tuple[float, dict[str, np.ndarray]]:
            x = series(rows, key)
            hit = np.where(np.isnan(x), np.nan, (x == code).astype(float))
            run = _running_mean(hit)
            return _last(run), {label: run}

        return f

    return rule


#: Every signal, in table order (data, not logic: one entry per signal, each
#: naming its metric once).
_TABLE: tuple[Signal, ...] = (
    Signal(
        metric="pool/exhaust_events",
        rule=share(True, "share of steps so far"),
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="pool/steps_to_exhaust_min",
        rule=median("forecast per step"),
        culprit=True,
        per_step=True,
    ),
    Signal(
        metric="pool/remaining_min",
        rule=remaining_spread,
        culprit=True,
        per_step=True,
    ),
    Signal(
        metric="tasks/{task}",
        name="tasks/min_share",
        rule=task_shares,
    ),
    Signal(
        metric="pool/steps_since_pick_max",
        rule=maximum("per step"),
        culprit=True,
        per_step=True,
    ),
    Signal(
        metric="databases/steps_since_pick_max",
        rule=maximum("per step"),
        per_step=True,
    ),
    Signal(
        metric="mix/tv_distance",
        rule=median("per step", late=True),
        per_step=True,
        late=True,
    ),
    Signal(
        metric="truncation/cells_dropped",
        rule=truncated_share,
    ),
    Signal(
        metric="padding/fraction",
        quantile="p50",
        rule=median("batch p50 per step"),
        per_step=True,
    ),
    Signal(
        metric="packing/segments_per_sequence",
        quantile="p50",
        rule=median("batch p50 per step"),
        per_step=True,
    ),
    Signal(
        metric="queue/depth_min",
        rule=share(False, "share of steps so far"),
        culprit=True,
    ),
    Signal(
        metric="queue/wait_seconds",
        rule=data_wait_share,
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="io/working_set_resident",
        rule=median("per step"),
        culprit=True,
        per_step=True,
    ),
    Signal(
        metric="io/read_amplification",
        rule=median("per step"),
        culprit=True,
        per_step=True,
    ),
    Signal(
        metric="trainer/verdict",
        name="verdict/input_bound",
        rule=verdict_share(1, "share of steps so far"),
        healthy=(0.0, 0.5),  # a loaded CPU makes some healthy steps wait: half the run
        what="share of steps the trainer judged input_bound (the wait spread over the ranks)",
        unit="share of steps",
    ),
    Signal(
        metric="trainer/verdict",
        name="verdict/input_straggler",
        rule=verdict_share(2, "share of steps so far"),
        healthy=(0.0, 0.2),
        what="share of steps the trainer judged input_straggler (one rank's wait dominates)",
        unit="share of steps",
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="trainer/verdict",
        name="verdict/io_bound",
        rule=verdict_share(4, "share of steps so far"),
        healthy=(0.0, 0.2),
        what="share of steps the trainer judged io_bound (the sampler threads blocked on page "
        "faults)",
        unit="share of steps",
    ),
    Signal(
        metric="trainer/verdict",
        name="verdict/cpu_starved",
        rule=verdict_share(3, "share of steps so far"),
        healthy=(0.0, 0.2),
        what="share of steps the trainer judged cpu_starved (the sampler threads runnable but "
        "not running)",
        unit="share of steps",
    ),
    Signal(
        metric="stalls",
        rule=total("running total"),
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="context/no_examples",
        rule=per_seed("per seed so far"),
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="link/candidate_recall",
        rule=minimum("per step"),
        culprit=True,
        per_step=True,
    ),
    Signal(
        metric="context/deadline_hits",
        rule=total("running total"),
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="stage/total_seconds",
        quantile="p50",
        rule=median("batch p50 per step"),
        per_step=True,
    ),
    Signal(
        metric="context/masked_cells",
        quantile="p95",
        rule=share_of_cells("batch p95 / filled cells per step"),
        per_step=True,
    ),
    Signal(
        metric="invariants/temporal_leaks",
        rule=total("running total"),
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="invariants/label_leaks",
        rule=total("running total"),
        culprit=True,
        counter=True,
    ),
    Signal(
        metric="invariants/duplicate_seeds",
        rule=total("running total"),
        culprit=True,
        counter=True,
    ),
)


SIGNALS: dict[str, Signal] = {s.name: s for s in _TABLE}
