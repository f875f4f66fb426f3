"""Ranking metrics of link tasks (recommendation), as RelBench defines them.

Owns: :func:`ranking_metrics` (MAP@k exactly as RelBench's
``link_prediction_map``, recall@k as its ``link_prediction_recall``, and
NDCG@k with binary gains) over groups of candidates, and :func:`score_links`
(one link task's pass: the model's ranking, the popularity and past-links
baselines, and the candidates' recall beside them).

A group is one (source, time) of the task; its candidates are the task's
seeds of that group (:mod:`headwater.preprocessing.links`). Each group is
ranked by score, highest first (ties by candidate order), and its top ``k``
compared with its **positives**, all of them: a positive the candidate
generator missed counts against every ranking (MAP divides by
``min(k, positives)``, recall by ``positives``), so ``candidate_recall``
(the share of a group's positives among its candidates, averaged over
groups) bounds what any ranking can reach.

Only groups whose every candidate was scored count: a pass cut by
``max_seeds`` drops its last, partial group.

Must never: score a group on part of its candidates; count a positive the
candidates missed as found.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

#: The metrics of a link task, in report order (``k`` is the task's ``eval_k``).
LINK_METRICS = ("map", "recall", "ndcg", "candidate_recall")
#: Below this share of the positives among the candidates, a link task's
#: evaluation warns: the ranking is scored on what the generator missed.
CANDIDATE_RECALL_FLOOR = 0.5


def candidate_warning(split: str, task: str, result: Any) -> str | None:
    """The warning for a link task's ``result`` whose candidates hold under
    :data:`CANDIDATE_RECALL_FLOOR` of its positives (else ``None``)."""
    if result.get("stype") != "link":
        return None
    recall = float(result["metrics"]["candidate_recall"])
    if not recall < CANDIDATE_RECALL_FLOOR:
        return None
    return (
        f"{split} {task}: the candidates hold {100 * recall:.1f}% of the positives "
        f"(under {100 * CANDIDATE_RECALL_FLOOR:.0f}%): no ranking finds the rest, so MAP and "
        "recall read the candidate generator, not the model; raise the task's `candidates`, "
        "or check that the source's history predicts its links"
    )


def _groups(group: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Sort order by group (stable) and each group's start in it."""
    order = np.argsort(group, kind="stable")
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, np.int64)
    return order, starts


def ranking_metrics(
    scores: npt.ArrayLike,
    linked: npt.ArrayLike,
    group: npt.ArrayLike,
    positives: npt.ArrayLike,
    k: int,
) -> dict[str, float]:
    """MAP@k, recall@k, NDCG@k and candidate recall, averaged over groups.

    Per candidate: ``scores`` (higher ranks first), ``linked`` (a positive),
    ``group`` and ``positives`` (its group's number of positives, found by
    the candidates or not)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(linked, dtype=bool)
    g = np.asarray(group, dtype=np.int64)
    n_pos = np.asarray(positives, dtype=np.int64)
    order, starts = _groups(g)
    if not len(starts):
        return {m: math.nan for m in LINK_METRICS}
    ends = np.r_[starts[1:], len(order)]
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    out = np.zeros((len(starts), 4))
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        idx = order[a:b]
        # Highest score first; ties keep candidate order.
        ranked = idx[np.argsort(-s[idx], kind="stable")]
        hits = y[ranked][:k].astype(np.float64)
        p = max(int(n_pos[idx[0]]), 1)
        prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
        out[i, 0] = float((prec * hits).sum()) / min(k, p)
        out[i, 1] = hits.sum() / p
        out[i, 2] = float((hits * discount[: len(hits)]).sum()) / float(discount[: min(k, p)].sum())
        out[i, 3] = float(y[idx].sum()) / p
    return dict(zip(LINK_METRICS, (float(v) for v in out.mean(axis=0)), strict=True))


def score_links(
    seeds: npt.NDArray[np.int64], y_pred: npt.NDArray[np.float64], table: Any
) -> dict[str, Any]:
    """One link task's pass: ``seeds`` (the task's seed positions scored)
    and ``y_pred`` (the model's probability of a link), with its sidecar
    ``table`` (:class:`headwater.preprocessing.links.LinkTable`) → the
    result entry (``stype`` ``"link"``, ``count`` groups, ``k``,
    ``metrics``, ``baseline`` (popularity before t) and ``past_links``)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    keep = (seeds >= 0) & (seeds < len(table.group))
    seeds, y_pred = seeds[keep], np.asarray(y_pred, dtype=np.float64)[keep]
    # Whole groups only: as many of a group's seeds scored as it has.
    g = table.group[seeds]
    size = np.bincount(table.group)
    seen = np.bincount(g, minlength=len(size))
    whole = seen[g] == size[g]
    seeds, y_pred, g = seeds[whole], y_pred[whole], g[whole]
    linked, n_pos, k = table.linked[seeds], table.positives[seeds], table.eval_k
    pop = table.popularity[seeds]
    # Past links first, popularity breaking ties.
    past = table.past[seeds] * (pop.max(initial=0.0) + 1.0) + pop
    return {
        "stype": "link",
        "count": len(np.unique(g)),
        "k": k,
        "metrics": ranking_metrics(y_pred, linked, g, n_pos, k),
        "baseline": ranking_metrics(pop, linked, g, n_pos, k),
        "past_links": ranking_metrics(past, linked, g, n_pos, k),
    }
