"""The PNG of ``headwater diag --plot``: one small multiple per signal.

Each panel plots the signal's *trace* (:mod:`.signals`): the quantity whose
statistic the title reports, over the steps: a running share, total or
ratio that ends at the value, or the per-step values whose median / maximum
is the value (drawn as a dashed line over the judged steps). The healthy
band is shaded green, the warm-up steps (left out of every statistic) grey;
both are in the legend, and the axes carry the step and the statistic's
unit.

Must never: plot a different quantity than the one the title judges, or
leave a task out of the task-share panel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headwater.diag.signals import SIGNALS, Rows
from headwater.diag.spec import DiagSpec
from headwater.diag.verdict import Verdict, _fmt


def _band(ax: Any, lo: float, hi: float) -> None:
    """Shade the healthy band, widening the y range to show its finite edges."""
    y0, y1 = ax.get_ylim()
    y0, y1 = min(y0, lo), max(y1, hi if math.isfinite(hi) else y1)
    pad = 0.03 * (y1 - y0 or 1.0)
    y0, y1 = y0 - pad, y1 + pad
    if lo == hi:
        ax.axhline(lo, color="tab:green", lw=2, alpha=0.4, label="healthy")
    else:
        ax.axhspan(
            max(lo, min(y0, lo)),
            min(hi, max(y1, lo)),
            color="tab:green",
            alpha=0.1,
            label="healthy band",
        )
    ax.set_ylim(y0, y1)


def _panel(ax: Any, spec: DiagSpec, rows: Rows, v: Verdict, ctx: Mapping[str, Any]) -> None:
    sig = SIGNALS[v.signal]
    steps = np.arange(len(rows))
    skip = min(spec.skip, len(rows))
    if sig.per_step:
        traces, x = sig.traces(rows, ctx), steps
    else:
        traces, x = sig.traces(rows[skip:], ctx), steps[skip:]
    for label, y in traces.items():
        ax.plot(x, y, lw=0.9, label=label)
    if not math.isnan(v.value) and not math.isinf(v.value):
        start = skip + (len(rows) - skip) // 2 if sig.late else skip
        ax.hlines(
            v.value,
            start,
            max(len(rows) - 1, start),
            colors="black",
            linestyles="dashed",
            lw=0.8,
            label=f"statistic = {_fmt(v.value)}",
        )
    ax.relim()
    ax.autoscale_view()
    _band(ax, *v.healthy)
    ax.axvspan(0, skip, color="grey", alpha=0.15, label="warm-up (not judged)")
    ax.set_xlim(0, max(len(rows) - 1, 1))
    color = "tab:green" if v.ok else "tab:red"
    ax.set_title(
        f"{v.signal}\n{_fmt(v.value)} ({'LIT' if v.lit else 'unlit'})", fontsize=8, color=color
    )
    ax.set_xlabel("step", fontsize=6)
    ax.set_ylabel(sig.unit, fontsize=6)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=5, loc="best", ncol=2 if len(traces) > 4 else 1)


def plot(
    path: Path,
    spec: DiagSpec,
    rows: Rows,
    verdicts: Sequence[Verdict],
    ctx: Mapping[str, Any],
) -> None:
    """Write the panels of one diagnostic run to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(verdicts)
    cols = 4
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows))
    for ax, v in zip(axes.flat, verdicts, strict=False):
        _panel(ax, spec, rows, v, ctx)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{spec.path.name}: {spec.description}"[:160], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
