"""Per-task evaluation metrics, with scikit-learn's definitions (as RelBench).

Owns: which metrics a target type gets (:data:`METRICS`), whether higher is
better (:data:`HIGHER_IS_BETTER`), :func:`score` (the metrics of one task's
predictions) and :func:`baseline` (the same metrics for the best constant
predictor, so a reader sees whether the model learned anything).

Inputs are the union of every rank's predictions for the task (gathered
before scoring, never averaged per rank), padding and null targets already
removed:

* numerical: ``y_true``, ``y_pred`` in the column's units → MAE, RMSE, R²
  (``mean_absolute_error``, ``root_mean_squared_error``, ``r2_score``);
  RelBench's regression metric is MAE (normalised by the train std);
* boolean: ``y_true`` in {0, 1}, ``y_pred`` the probability of 1 → AUROC
  (``roc_auc_score``, RelBench's classification metric), average precision
  (``average_precision_score``), accuracy at 0.5;
* categorical: class indices → accuracy, macro-F1 (``f1_score(average="macro")``);
* timestamp (cell-masking tasks on a time column): the z-scored epoch
  component → MAE, RMSE in standard deviations of the database's times.

A metric that is undefined on the labels (AUROC with one class, R² with one
value) is ``nan``, never a made-up number.

The baseline is the best constant prediction chosen with the evaluated labels
themselves (their mean for numerical and time targets, their majority class
or positive rate otherwise): an optimistic trivial baseline, so beating it
means the model learned something from the inputs.

Must never: average per-rank metrics; score padded sequences.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

#: Target type code (``target_stype``) → name.
STYPES: dict[int, str] = {0: "numerical", 1: "boolean", 2: "timestamp", 3: "categorical"}

#: Metrics per target type, in report order.
METRICS: dict[str, tuple[str, ...]] = {
    "numerical": ("mae", "rmse", "r2"),
    "boolean": ("auroc", "average_precision", "accuracy"),
    "categorical": ("accuracy", "macro_f1"),
    "timestamp": ("mae", "rmse"),
}

#: Whether a larger value of the metric is better (W&B summaries, tables).
HIGHER_IS_BETTER: dict[str, bool] = {
    "mae": False,
    "rmse": False,
    "r2": True,
    "auroc": True,
    "average_precision": True,
    "accuracy": True,
    "macro_f1": True,
    # Link tasks (:mod:`headwater.evaluation.ranking`).
    "map": True,
    "recall": True,
    "ndcg": True,
    "candidate_recall": True,
}

Array = npt.NDArray[np.float64]


def _defined(fn: Callable[[], float]) -> float:
    """``fn()`` as a float, ``nan`` where scikit-learn calls it undefined."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            v = float(fn())
        except ValueError:
            return math.nan
    return v


def _metric_fns(stype: str, y: Array, p: Array) -> dict[str, Callable[[], float]]:
    import sklearn.metrics as skm

    if stype in ("numerical", "timestamp"):
        fns: dict[str, Callable[[], float]] = {
            "mae": lambda: skm.mean_absolute_error(y, p),
            "rmse": lambda: skm.root_mean_squared_error(y, p),
        }
        if stype == "numerical":
            fns["r2"] = lambda: skm.r2_score(y, p) if np.unique(y).size > 1 else math.nan
        return fns
    if stype == "boolean":
        yb = y.astype(np.int64)
        return {
            "auroc": lambda: skm.roc_auc_score(yb, p),
            "average_precision": lambda: (
                skm.average_precision_score(yb, p) if yb.any() else math.nan
            ),
            "accuracy": lambda: skm.accuracy_score(yb, (p >= 0.5).astype(np.int64)),
        }
    if stype == "categorical":
        yc, pc = y.astype(np.int64), p.astype(np.int64)
        return {
            "accuracy": lambda: skm.accuracy_score(yc, pc),
            "macro_f1": lambda: skm.f1_score(yc, pc, average="macro"),
        }
    raise ValueError(f"invalid target type {stype!r}: expected one of {sorted(METRICS)}")


def score(stype: str, y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> dict[str, float]:
    """The metrics of :data:`METRICS` ``[stype]`` on one task's predictions."""
    y = np.asarray(y_true, dtype=np.float64).ravel()
    p = np.asarray(y_pred, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise ValueError(f"y_true has {y.size} values but y_pred has {p.size}")
    if y.size == 0:
        return {m: math.nan for m in METRICS[stype]}
    return {name: _defined(fn) for name, fn in _metric_fns(stype, y, p).items()}


def constant_prediction(stype: str, y_true: npt.ArrayLike) -> Array:
    """The best constant predictor's predictions for ``y_true``."""
    y = np.asarray(y_true, dtype=np.float64).ravel()
    if y.size == 0:
        return y
    if stype in ("numerical", "timestamp"):
        c = float(np.mean(y))
    elif stype == "boolean":
        c = float(np.mean(y))  # the positive rate: a calibrated constant probability
    else:
        values, counts = np.unique(y, return_counts=True)
        c = float(values[int(np.argmax(counts))])
    return np.full_like(y, c)


def baseline(stype: str, y_true: npt.ArrayLike) -> dict[str, float]:
    """:func:`score` of :func:`constant_prediction` (mean / majority)."""
    return score(stype, y_true, constant_prediction(stype, y_true))


def format_table(results: Mapping[str, Mapping[str, Mapping[str, object]]]) -> str:
    """A per-task table: ``results[split][task] = {"stype", "count",
    "metrics", "baseline"}`` → one line per (split, task, metric), then a
    warning line per link task whose candidates miss most positives
    (:func:`~headwater.evaluation.ranking.candidate_warning`)."""
    from headwater.evaluation.ranking import candidate_warning

    lines = [f"{'split':<5} {'task':<28} {'metric':<18} {'model':>10} {'baseline':>10} {'n':>7}"]
    for split, tasks in results.items():
        for task, r in tasks.items():
            metrics = r["metrics"]
            base = r["baseline"]
            assert isinstance(metrics, Mapping) and isinstance(base, Mapping)
            for m, v in metrics.items():
                lines.append(
                    f"{split:<5} {task[:28]:<28} {m:<18} {float(v):>10.4f} "
                    f"{float(base[m]):>10.4f} {r['count']!s:>7}"
                )
    warnings = [candidate_warning(split, task, r) for split, tasks in results.items() for task, r in tasks.items()]
    lines.extend(f"warning: {w}" for w in warnings if w)
    return "\n".join(lines)
