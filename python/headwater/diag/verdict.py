"""The verdict of a diagnostic run: every signal judged over rank 0's
``metrics.jsonl``.

A signal is *lit* when its statistic leaves the healthy band. A config
passes when every signal it declares is lit inside its declared band (and,
where it names one, the culprit rank is the one reported by the
``_argmin_rank`` / ``_argmax_rank`` sibling in most steps) and every other
signal is unlit: false positives count as failures, except for the signals
the config lists as host-dependent, which pass either way (reported as such).

The statistics read rank 0's ``metrics.jsonl`` (the cross-rank reduction,
written by ``headwater train`` every step), so they see exactly what the
W&B panels and the dashboards show. Steps before ``skip`` (compilation,
pool start-up) are left out.

Owns: :class:`Verdict`, :func:`read_rows`, :func:`context`,
:func:`evaluate`, :func:`format_table` (each statistic named in words) and
:func:`format_matrix` (pathology × signal).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headwater.diag.signals import SIGNALS, Rows, series
from headwater.diag.spec import DiagSpec, Expect
from headwater.telemetry import PREFIX as P


@dataclasses.dataclass(frozen=True)
class Verdict:
    signal: str
    value: float
    healthy: tuple[float, float]
    lit: bool
    expected: bool
    band: tuple[float, float] | None
    culprit: int | None  # the most frequent culprit rank, when the signal has one
    culprit_share: float
    ok: bool
    why: str


def _inside(x: float, band: tuple[float, float]) -> bool:
    return band[0] <= x <= band[1]


def read_rows(run_dir: Path) -> tuple[Rows, Rows]:
    """``(telemetry rows, trainer rows)`` of rank 0's ``metrics.jsonl``, by step."""
    by_step: dict[int, dict[str, float]] = {}
    path = Path(run_dir) / "metrics.jsonl"
    with path.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            by_step.setdefault(int(row.pop("step")), {}).update(row)
    rows = [by_step[s] for s in sorted(by_step)]
    return [r for r in rows if f"{P}batches" in r], [r for r in rows if "trainer/loss" in r]


def _culprit(name: str, steady: Rows) -> tuple[int | None, float]:
    """The rank the signal's ``_arg*_rank`` sibling names most often, and how often."""
    sig = SIGNALS[name]
    if not sig.culprit_key:
        return None, 0.0
    at = [r for r in steady if not sig.counter or r.get(sig.key, 0.0) > 0]
    picked = series(at, sig.culprit_key)
    ranks = picked[~np.isnan(picked)].astype(int)
    if not ranks.size:
        return None, 0.0
    counts = np.bincount(ranks)
    return int(counts.argmax()), float(counts.max() / ranks.size)


def _judge(
    value: float, lit: bool, exp: Expect | None, culprit: int | None, share: float
) -> tuple[bool, str]:
    if exp is None:
        return not lit, "unlit" if not lit else "lit, not declared (false positive)"
    if math.isnan(value) or not _inside(value, exp.band):
        return False, f"declared lit in {list(exp.band)}, value outside"
    if not lit:
        return False, "declared band overlaps the healthy band: value is healthy"
    if exp.culprit_rank is not None and (culprit != exp.culprit_rank or share < 0.5):
        return False, f"culprit rank {culprit} ({share:.0%} of steps), declared {exp.culprit_rank}"
    return True, "lit as declared"


def evaluate(spec: DiagSpec, rows: Rows, ctx: Mapping[str, Any]) -> list[Verdict]:
    """One :class:`Verdict` per signal, over ``rows[spec.skip:]``."""
    steady = rows[spec.skip :]
    out = []
    for name, sig in SIGNALS.items():
        value = sig.stat(steady, ctx)
        lit = not (math.isnan(value) or _inside(value, sig.band))
        exp = spec.expect.get(name)
        culprit, share = _culprit(name, steady)
        ok, why = _judge(value, lit, exp, culprit, share)
        if name in spec.host_dependent:
            ok, why = True, f"host-dependent: {'lit' if lit else 'unlit'} on this host"
        band = exp.band if exp else None
        out.append(
            Verdict(name, value, sig.band, lit, exp is not None, band, culprit, share, ok, why)
        )
    return out


def context(cfg: Any, spec: DiagSpec, db: Path) -> dict[str, Any]:
    from headwater.mixture import reported_task_names, sampler_source

    kw = cfg.sampler_kwargs(0)
    # A mixture reports per-task series for its reported databases' tasks only.
    reported = reported_task_names(
        db, kw.get("telemetry_top_databases", 8), kw.get("telemetry_databases", ())
    )
    weights = dict.fromkeys(reported, 1.0)
    # The config's task_weights, else a mixture file's (its `tasks` and
    # `task_weights`), as `headwater.mixture.open_sampler` opens it.
    given = kw.get("task_weights") or sampler_source(db)[1].get("task_weights") or {}
    weights.update({t: w for t, w in given.items() if t in weights})
    return {
        "task_weights": weights,
        "sequence_length": kw["default_sequence_length"],
        "processes": spec.processes,
    }


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def format_table(spec: DiagSpec, verdicts: Sequence[Verdict]) -> str:
    """The verdict table; under each signal, what its statistic is in words."""
    head = f"{'signal':<28} {'value':>10}  {'healthy':<16} {'lit':<5} {'expected':<22} verdict"
    lines = [f"{spec.path.name}: {spec.description}".strip(), head, "-" * len(head)]
    for v in verdicts:
        healthy = f"[{_fmt(v.healthy[0])}, {_fmt(v.healthy[1])}]"
        expected = f"lit in [{_fmt(v.band[0])}, {_fmt(v.band[1])}]" if v.band else "-"
        culprit = (
            f" rank {v.culprit} ({v.culprit_share:.0%})" if v.lit and v.culprit is not None else ""
        )
        lines.append(
            f"{v.signal:<28} {_fmt(v.value):>10}  {healthy:<16} {'LIT' if v.lit else '-':<5} "
            f"{expected:<22} {'ok' if v.ok else 'MISMATCH'}: {v.why}{culprit}"
        )
        sig = SIGNALS[v.signal]
        lines.append(f"  {'':<26} value = {sig.what} ({sig.unit})")
    ok = all(v.ok for v in verdicts)
    lines.append(f"verdict: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines)


@dataclasses.dataclass
class DiagResult:
    """One diagnostic run: its spec, verdicts, run directory and summaries."""

    spec: DiagSpec
    verdicts: list[Verdict]
    run_dir: Path
    summaries: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def format_matrix(results: Sequence[DiagResult]) -> str:
    """Pathology × signal: ``LIT`` declared and lit, ``miss`` declared but
    unlit, ``FP`` lit but undeclared, ``host`` host-dependent (either
    way), ``.`` unlit and undeclared."""
    names = list(SIGNALS)
    short = [n.split("/")[-1][:10] for n in names]
    width = max(len(r.spec.path.stem) for r in results) + 1
    lines = [" " * width + " ".join(f"{s:>10}" for s in short)]
    for r in results:
        cells = []
        for v in r.verdicts:
            cell = ("LIT" if v.lit else "miss") if v.expected else ("FP" if v.lit else ".")
            if v.why.startswith("host-dependent"):
                cell = "host"
            cells.append(f"{cell:>10}")
        lines.append(f"{r.spec.path.stem:<{width}}" + " ".join(cells) + ("" if r.ok else "  FAIL"))
    lines.append("columns: " + ", ".join(f"{s} = {n}" for s, n in zip(short, names, strict=True)))
    return "\n".join(lines)
