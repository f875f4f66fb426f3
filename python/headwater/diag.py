"""``headwater diag``: run a diagnostic config and check which signals light up.

Owns: the signal table (:data:`SIGNALS`: for each sampler-health signal, the
reduced telemetry key it reads, the statistic taken over the run's steps and
the healthy band), the ``[diag]`` section of a config (what it must light,
with the band that counts as lit and, for cross-rank signals, the culprit
rank), the verdict (:func:`evaluate`), the table, the pathology × signal
matrix of ``--all`` and the PNG of ``--plot``.

A signal is *lit* when its statistic leaves the healthy band. A config
passes when every signal it declares is lit inside its declared band (and,
where it names one, the culprit rank is the one reported by the
``_argmin_rank`` / ``_argmax_rank`` sibling in most steps) and every other
signal is unlit: false positives count as failures.

The statistics read rank 0's ``metrics.jsonl`` (the cross-rank reduction,
written by ``headwater train`` every step), so they see exactly what the
W&B panels and the dashboards show. Steps before ``skip`` (compilation,
pool start-up) are left out; ``mix/tv_distance`` is read only once its
64-batch window is mostly full (the second half of the run).

A ``[diag]`` section::

    [diag]
    description = "what this config twists and what should happen"
    processes = 2                    # local processes (cross-rank pathologies)
    [[diag.expect]]
    signal = "pool/remaining_min"
    band = [0.0, 0.01]               # the statistic's lit band
    culprit_rank = 1                 # optional
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headwater.errors import ConfigError

P = "sampler/"
INF = math.inf
Rows = list[dict[str, float]]


@dataclasses.dataclass(frozen=True)
class Signal:
    """One health signal: ``stat(rows, ctx)`` must stay inside ``healthy``."""

    name: str
    key: str  # the reduced key plotted for it
    stat: Callable[[Rows, Mapping[str, Any]], float]
    healthy: tuple[float, float]
    what: str  # the statistic, in words
    culprit_key: str | None = None  # the _arg*_rank sibling naming the culprit
    #: A counter: its culprit is read only at steps where it counted something
    #: (at a step where every rank has 0, the tie names rank 0).
    counter: bool = False


def _series(rows: Rows, key: str) -> np.ndarray:
    return np.array([r[key] for r in rows if key in r and r[key] is not None], dtype=float)


def _share(key: str, positive: bool) -> Callable[[Rows, Mapping[str, Any]], float]:
    """The share of steps where ``key`` is > 0 (``positive``) or <= 0."""

    def f(rows: Rows, ctx: Mapping[str, Any]) -> float:
        x = _series(rows, key)
        return float(np.mean((x > 0) == positive)) if x.size else math.nan

    return f


def _median(key: str, late: bool = False) -> Callable[[Rows, Mapping[str, Any]], float]:
    def f(rows: Rows, ctx: Mapping[str, Any]) -> float:
        x = _series(rows[len(rows) // 2 :] if late else rows, key)
        return float(np.median(x)) if x.size else math.nan

    return f


def _max(key: str) -> Callable[[Rows, Mapping[str, Any]], float]:
    def f(rows: Rows, ctx: Mapping[str, Any]) -> float:
        x = _series(rows, key)
        return float(np.max(x)) if x.size else math.nan

    return f


def _total(key: str) -> Callable[[Rows, Mapping[str, Any]], float]:
    def f(rows: Rows, ctx: Mapping[str, Any]) -> float:
        return float(np.sum(_series(rows, key)))

    return f


def _min_task_share(rows: Rows, ctx: Mapping[str, Any]) -> float:
    """The smallest share of drawn seeds among tasks with a configured weight > 0."""
    tasks = [t for t, w in ctx["task_weights"].items() if w > 0]
    drawn = {t: float(np.sum(_series(rows, f"{P}tasks/{t}"))) for t in tasks}
    total = sum(drawn.values())
    return min(drawn.values()) / total if total > 0 else math.nan


def _truncated_share(rows: Rows, ctx: Mapping[str, Any]) -> float:
    """Cells dropped by the budget per cell of budget (dropped / (batches · S))."""
    dropped = float(np.sum(_series(rows, f"{P}truncation/cells_dropped")))
    batches = float(np.sum(_series(rows, f"{P}batches")))
    return dropped / (batches * ctx["sequence_length"]) if batches else math.nan


def _remaining_spread(rows: Rows, ctx: Mapping[str, Any]) -> float:
    """Median of remaining_min / remaining_max (smallest pool left vs largest)."""
    lo, hi = _series(rows, f"{P}pool/remaining_min"), _series(rows, f"{P}pool/remaining_max")
    n = min(lo.size, hi.size)
    if n == 0:
        return math.nan
    return float(np.median(lo[:n] / np.maximum(hi[:n], 1.0)))


def _data_wait_share(rows: Rows, ctx: Mapping[str, Any]) -> float:
    """Seconds the ranks blocked on the queue over rank-seconds of training."""
    wait = step = 0.0
    for r in rows:
        if f"{P}queue/wait_seconds" in r and "trainer/step_seconds" in r:
            wait += r[f"{P}queue/wait_seconds"]
            step += r["trainer/step_seconds"] * ctx["processes"]
    return wait / step if step > 0 else math.nan


SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in [
        Signal(
            "pool/exhaust_events",
            f"{P}pool/exhaust_events",
            _share(f"{P}pool/exhaust_events", positive=True),
            (0.0, 0.2),
            "share of steps with a pool exhausted",
            f"{P}pool/exhaust_events_argmax_rank",
            counter=True,
        ),
        Signal(
            "pool/steps_to_exhaust_min",
            f"{P}pool/steps_to_exhaust_min",
            _median(f"{P}pool/steps_to_exhaust_min"),
            (25.0, INF),
            "median forecast of batches until the next exhaustion",
            f"{P}pool/steps_to_exhaust_min_argmin_rank",
        ),
        Signal(
            "pool/remaining_min",
            f"{P}pool/remaining_min",
            _remaining_spread,
            (0.02, INF),
            "median remaining_min / remaining_max",
            f"{P}pool/remaining_min_argmin_rank",
        ),
        Signal(
            "tasks/min_share",
            f"{P}tasks/",
            _min_task_share,
            (0.05, 1.0),
            "smallest task's share of drawn seeds (weighted tasks)",
        ),
        Signal(
            "pool/steps_since_pick_max",
            f"{P}pool/steps_since_pick_max",
            _max(f"{P}pool/steps_since_pick_max"),
            (0.0, 60.0),
            "largest batches-since-picked of a weighted task",
            f"{P}pool/steps_since_pick_max_argmax_rank",
        ),
        Signal(
            "mix/tv_distance",
            f"{P}mix/tv_distance",
            _median(f"{P}mix/tv_distance", late=True),
            (0.0, 0.25),
            "median TV distance, realised vs configured mix (2nd half)",
        ),
        Signal(
            "truncation/cells_dropped",
            f"{P}truncation/cells_dropped",
            _truncated_share,
            (0.0, 2.0),
            "cells dropped per cell of sequence budget",
        ),
        Signal(
            "padding/fraction_p50",
            f"{P}padding/fraction_p50",
            _median(f"{P}padding/fraction_p50"),
            (0.05, 0.85),
            "median p50 padding share",
        ),
        Signal(
            "queue/depth_min",
            f"{P}queue/depth_min",
            _share(f"{P}queue/depth_min", positive=False),
            (0.0, 0.2),
            "share of steps that found the queue empty",
            f"{P}queue/depth_min_argmin_rank",
        ),
        Signal(
            "queue/wait_seconds",
            f"{P}queue/wait_seconds",
            _data_wait_share,
            (0.0, 0.05),
            "data-wait share of rank time",
            f"{P}queue/wait_seconds_argmax_rank",
            counter=True,
        ),
        Signal(
            "stage/total_seconds_p50",
            f"{P}stage/total_seconds_p50",
            _median(f"{P}stage/total_seconds_p50"),
            (0.0, 0.05),
            "median p50 batch latency (s)",
        ),
        Signal(
            "invariants/temporal_leaks",
            f"{P}invariants/temporal_leaks",
            _total(f"{P}invariants/temporal_leaks"),
            (0.0, 0.0),
            "rows after the observation time (run total)",
            f"{P}invariants/temporal_leaks_argmax_rank",
            counter=True,
        ),
        Signal(
            "invariants/duplicate_seeds",
            f"{P}invariants/duplicate_seeds",
            _total(f"{P}invariants/duplicate_seeds"),
            (0.0, 0.0),
            "seeds drawn twice in one epoch (run total)",
            f"{P}invariants/duplicate_seeds_argmax_rank",
            counter=True,
        ),
    ]
}


# ---------------------------------------------------------------------------
# Expectations
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Expect:
    signal: str
    band: tuple[float, float]
    culprit_rank: int | None = None


@dataclasses.dataclass(frozen=True)
class DiagSpec:
    path: Path
    description: str
    processes: int
    skip: int
    expect: dict[str, Expect]


def _band(where: str, value: Any) -> tuple[float, float]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        or value[0] > value[1]
    ):
        raise ConfigError(
            f"{where}: band must be [low, high] numbers with low <= high, got {value!r}"
        )
    return float(value[0]), float(value[1])


def load_spec(path: str | Path, **overrides: Any) -> tuple[DiagSpec, Any]:
    """The ``[diag]`` section of ``path`` and its :class:`TrainConfig`
    (with ``overrides``, dotted keys as in ``load_config``)."""
    from headwater.train_config import load_config

    cfg = load_config(path, **overrides)
    where = str(path)
    raw = dict(cfg.diag)
    known = {"description", "processes", "skip", "expect"}
    for k in raw:
        if k not in known:
            raise ConfigError(
                f"{where}: unknown key `diag.{k}` (known: {', '.join(sorted(known))})"
            )
    processes = raw.get("processes", 1)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ConfigError(f"{where}: `diag.processes` must be an integer >= 1, got {processes!r}")
    skip = raw.get("skip", 10)
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise ConfigError(f"{where}: `diag.skip` must be an integer >= 0, got {skip!r}")
    expect: dict[str, Expect] = {}
    for i, e in enumerate(raw.get("expect", [])):
        w = f"{where}: diag.expect[{i}]"
        if not isinstance(e, Mapping):
            raise ConfigError(f"{w} must be a table")
        bad = sorted(set(e) - {"signal", "band", "culprit_rank"})
        if bad:
            raise ConfigError(f"{w}: unknown key `{bad[0]}` (known: signal, band, culprit_rank)")
        name = e.get("signal")
        if name not in SIGNALS:
            raise ConfigError(f"{w}: unknown signal {name!r} (known: {', '.join(SIGNALS)})")
        culprit = e.get("culprit_rank")
        if culprit is not None:
            if SIGNALS[name].culprit_key is None:
                raise ConfigError(f"{w}: signal {name!r} has no culprit rank")
            if isinstance(culprit, bool) or not isinstance(culprit, int):
                raise ConfigError(f"{w}: culprit_rank must be an integer")
            if not 0 <= culprit < processes:
                raise ConfigError(
                    f"{w}: culprit_rank {culprit} is outside 0..{processes - 1} (diag.processes)"
                )
        if name in expect:
            raise ConfigError(f"{w}: signal {name!r} is declared twice")
        expect[name] = Expect(name, _band(w, e.get("band")), culprit)
    desc = raw.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(f"{where}: `diag.description` must be a string")
    return DiagSpec(Path(path), desc, processes, skip, expect), cfg


# ---------------------------------------------------------------------------
# Verdict
# ---------------------------------------------------------------------------


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


def evaluate(spec: DiagSpec, rows: Rows, ctx: Mapping[str, Any]) -> list[Verdict]:
    """One :class:`Verdict` per signal, over ``rows[spec.skip:]``."""
    steady = rows[spec.skip :]
    out = []
    for name, sig in SIGNALS.items():
        value = sig.stat(steady, ctx)
        lit = not (math.isnan(value) or _inside(value, sig.healthy))
        exp = spec.expect.get(name)
        culprit, share = None, 0.0
        if sig.culprit_key:
            at = [r for r in steady if not sig.counter or r.get(sig.key, 0.0) > 0]
            ranks = _series(at, sig.culprit_key).astype(int)
            if ranks.size:
                counts = np.bincount(ranks)
                culprit, share = int(counts.argmax()), float(counts.max() / ranks.size)
        if exp is None:
            ok, why = not lit, "unlit" if not lit else "lit, not declared (false positive)"
        elif math.isnan(value) or not _inside(value, exp.band):
            ok, why = False, f"declared lit in {list(exp.band)}, value outside"
        elif not lit:
            ok, why = False, "declared band overlaps the healthy band: value is healthy"
        elif exp.culprit_rank is not None and (culprit != exp.culprit_rank or share < 0.5):
            ok, why = (
                False,
                f"culprit rank {culprit} ({share:.0%} of steps), declared {exp.culprit_rank}",
            )
        else:
            ok, why = True, "lit as declared"
        out.append(
            Verdict(
                name,
                value,
                sig.healthy,
                lit,
                exp is not None,
                exp.band if exp else None,
                culprit,
                share,
                ok,
                why,
            )
        )
    return out


def context(cfg: Any, spec: DiagSpec, db: Path) -> dict[str, Any]:
    meta = json.loads((Path(db) / "metadata.json").read_text(encoding="utf-8"))
    kw = cfg.sampler_kwargs(0)
    weights = dict.fromkeys((t["name"] for t in meta["tasks"]), 1.0)
    weights.update(kw.get("task_weights") or {})
    return {
        "task_weights": weights,
        "sequence_length": kw.get("default_sequence_length", 1024),
        "processes": spec.processes,
    }


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def format_table(spec: DiagSpec, verdicts: Sequence[Verdict]) -> str:
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
    ok = all(v.ok for v in verdicts)
    lines.append(f"verdict: {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines)


def plot(
    path: Path, spec: DiagSpec, rows: Rows, trainer: Rows, verdicts: Sequence[Verdict]
) -> None:
    """Small multiples: each signal's metric over steps, bands shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(verdicts)
    cols = 4
    fig, axes = plt.subplots(-(-n // cols), cols, figsize=(4 * cols, 2.6 * -(-n // cols)))
    steps = np.arange(len(rows))
    for ax, v in zip(axes.flat, verdicts):
        sig = SIGNALS[v.signal]
        if sig.name == "tasks/min_share":
            for key in sorted(
                k for k in rows[0] if k.startswith(f"{P}tasks/") and "_" not in k[-5:]
            ):
                if key.endswith(("_max", "_rank")):
                    continue
                ax.plot(steps, [r.get(key, np.nan) for r in rows], lw=0.8, label=key[len(P) + 6 :])
            ax.legend(fontsize=5)
        elif sig.name == "queue/wait_seconds":
            share = [
                r.get(f"{P}queue/wait_seconds", np.nan)
                / max(t.get("trainer/step_seconds", np.nan) * spec.processes, 1e-12)
                for r, t in zip(rows, trainer)
            ]
            ax.plot(steps[: len(share)], share, lw=0.8)
            ax.axhspan(*v.healthy, color="tab:green", alpha=0.08)
        else:
            ax.plot(steps, [r.get(sig.key, np.nan) for r in rows], lw=0.8)
        ax.axvspan(0, spec.skip, color="grey", alpha=0.1)
        color = "tab:green" if v.ok else "tab:red"
        ax.set_title(
            f"{v.signal}\n{_fmt(v.value)} ({'LIT' if v.lit else 'unlit'})", fontsize=8, color=color
        )
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{spec.path.name}: {spec.description}"[:160], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class DiagResult:
    spec: DiagSpec
    verdicts: list[Verdict]
    run_dir: Path
    summaries: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def run_diag(
    path: str | Path,
    *,
    out_dir: str | Path = "runs/diag",
    db: str | None = None,
    plot_to: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    timeout_s: float | None = 1800,
) -> DiagResult:
    """Run the config (``headwater train`` with its ``[diag]`` processes),
    then evaluate every signal."""
    from headwater.train import launch, resolve_database, run_directory

    ov = {"logging.dir": str(out_dir), "logging.jsonl": True, **(overrides or {})}
    if db:
        ov["database.path"] = db
    spec, cfg = load_spec(path, **ov)
    name = Path(path).stem
    summaries = launch(path, num_processes=spec.processes, run_name=name, timeout_s=timeout_s, **ov)
    run_dir = run_directory(cfg, name)
    rows, trainer = read_rows(run_dir)
    verdicts = evaluate(spec, rows, context(cfg, spec, resolve_database(cfg)))
    if plot_to:
        plot(Path(plot_to), spec, rows, trainer, verdicts)
    return DiagResult(spec, verdicts, run_dir, summaries)


def format_matrix(results: Sequence[DiagResult]) -> str:
    """Pathology × signal: ``LIT`` declared and lit, ``miss`` declared but
    unlit, ``FP`` lit but undeclared, ``.`` unlit and undeclared."""
    names = list(SIGNALS)
    short = [n.split("/")[-1][:10] for n in names]
    width = max(len(r.spec.path.stem) for r in results) + 1
    lines = [" " * width + " ".join(f"{s:>10}" for s in short)]
    for r in results:
        cells = []
        for v in r.verdicts:
            cell = ("LIT" if v.lit else "miss") if v.expected else ("FP" if v.lit else ".")
            cells.append(f"{cell:>10}")
        lines.append(f"{r.spec.path.stem:<{width}}" + " ".join(cells) + ("" if r.ok else "  FAIL"))
    lines.append("columns: " + ", ".join(f"{s} = {n}" for s, n in zip(short, names)))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="headwater diag", description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*", help="diagnostic configs (TOML with a [diag] section)")
    ap.add_argument("--all", action="store_true", help="run every config in --configs-dir")
    ap.add_argument("--configs-dir", default="diag_configs")
    ap.add_argument("--plot", help="PNG of the signals over steps (one config)")
    ap.add_argument("--db", help="database to run on (default: each config's)")
    ap.add_argument("--dir", default="runs/diag", help="where runs are written")
    ap.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    ap.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override a config key of every run (value read as TOML)",
    )
    a = ap.parse_args(argv)
    from headwater.train_config import parse_overrides

    overrides = parse_overrides(a.set)
    paths = [Path(p) for p in a.configs]
    if a.all:
        d = Path(a.configs_dir)
        if not d.is_dir():
            raise ConfigError(f"--configs-dir {d}: no such directory")
        paths += sorted(d.glob("*.toml"))
    if not paths:
        ap.error("give a config or --all")
    if a.plot and len(paths) != 1:
        ap.error("--plot needs exactly one config")
    results = []
    for p in paths:
        r = run_diag(p, out_dir=a.dir, db=a.db, plot_to=a.plot, overrides=overrides)
        results.append(r)
        if a.json:
            print(
                json.dumps(
                    {
                        "config": str(p),
                        "ok": r.ok,
                        "run_dir": str(r.run_dir),
                        "verdicts": [dataclasses.asdict(v) for v in r.verdicts],
                    }
                )
            )
        else:
            print(format_table(r.spec, r.verdicts), flush=True)
            if a.plot:
                print(f"panels: {a.plot}")
    if len(results) > 1 and not a.json:
        print(format_matrix(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
