"""The diag signals, their traces and panels, on synthetic rows (no run).

Each panel must plot the quantity its title judges: a running statistic ends
at the value, per-step values have the value as their median / maximum; the
task-share panel traces every task of the database whatever its name; the
panels carry axis labels and a legend for the bands; the verdict table says
in words what each statistic is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from headwater.diag import SIGNALS, DiagSpec, evaluate, format_table
from headwater.diag.plot import _panel, plot
from headwater.telemetry import PREFIX as P

# Names that defeated a suffix filter before: an underscore in the last five
# characters, or a suffix the reducer also uses.
TASKS = {"order_priority": 2.0, "customer_repeat_order_90d": 1.0, "x_max": 1.0, "zero": 0.0}
STEPS = 60


def rows(seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(STEPS):
        r: dict[str, Any] = {
            f"{P}batches": 2.0,
            f"{P}pool/exhaust_events": float(rng.random() < 0.3),
            f"{P}pool/exhaust_events_argmax_rank": 1.0,
            f"{P}pool/steps_to_exhaust_min": float(rng.integers(0, 50)),
            f"{P}pool/remaining_min": float(rng.integers(0, 100)),
            f"{P}pool/remaining_max": 100.0 + t,
            f"{P}pool/steps_since_pick_max": float(rng.integers(0, 80)),
            f"{P}databases/steps_since_pick_max": float(rng.integers(0, 40)),
            f"{P}mix/tv_distance": float(rng.random()),
            f"{P}truncation/cells_dropped": float(rng.integers(0, 300)),
            f"{P}padding/fraction_p50": float(rng.random()),
            f"{P}packing/segments_per_sequence_p50": float(rng.integers(1, 5)),
            f"{P}context/masked_cells_p95": float(rng.integers(0, 64)),
            f"{P}queue/depth_min": float(rng.integers(0, 2)),
            f"{P}queue/depth_min_argmin_rank": 0.0,
            f"{P}queue/wait_seconds": float(rng.random() * 0.01),
            f"{P}stage/total_seconds_p50": float(rng.random() * 0.1),
            f"{P}io/working_set_resident": float(rng.random()),
            f"{P}io/read_amplification": float(rng.random() * 20),
            f"{P}invariants/temporal_leaks": float(rng.integers(0, 3)),
            f"{P}invariants/duplicate_seeds": 0.0,
            f"{P}invariants/label_leaks": 0.0,
            f"{P}link/candidate_recall": float(rng.random()),
            "trainer/step_seconds": 0.1,
            "trainer/verdict": float(rng.integers(0, 3)),
            "trainer/verdict_rank": 1.0,
        }
        for name, w in TASKS.items():
            r[f"{P}tasks/{name}"] = float(rng.integers(0, 10)) if w > 0 else 0.0
        out.append(r)
    return out


CTX = {"task_weights": TASKS, "sequence_length": 64, "processes": 2}
SPEC = DiagSpec(Path("synthetic.toml"), "synthetic rows", 2, 10, {})


@pytest.mark.parametrize("name", list(SIGNALS))
def test_each_trace_shows_the_statistic_it_judges(name: str) -> None:
    sig = SIGNALS[name]
    steady = rows()[SPEC.skip :]
    value = sig.stat(steady, CTX)
    traces = sig.traces(steady, CTX)
    assert traces and all(len(y) == len(steady) for y in traces.values())
    if name == "tasks/min_share":
        finals = {t: y[-1] for t, y in traces.items() if TASKS[t] > 0}
        assert value == pytest.approx(min(finals.values()))
    elif sig.per_step:
        (y,) = traces.values()
        judged = y[len(y) // 2 :] if name == "mix/tv_distance" else y
        maxed = {"pool/steps_since_pick_max", "databases/steps_since_pick_max"}
        agg = np.nanmax if name in maxed else np.nanmin if name == "link/candidate_recall" else np.nanmedian
        assert value == pytest.approx(float(agg(judged)))
    else:
        (y,) = traces.values()
        assert value == pytest.approx(float(y[-1]))
    assert not math.isnan(value)


def test_every_task_is_traced_whatever_its_name() -> None:
    data = rows()
    traces = SIGNALS["tasks/min_share"].traces(data, CTX)
    assert set(traces) == set(TASKS)
    drawn = {t: sum(r[f"{P}tasks/{t}"] for r in data) for t in TASKS}
    for t in TASKS:  # each final share from the raw counts
        assert traces[t][-1] == pytest.approx(drawn[t] / sum(drawn.values())), t
    assert traces["zero"][-1] == 0.0


def test_panels_label_axes_and_explain_the_bands() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows()
    verdicts = {v.signal: v for v in evaluate(SPEC, data, CTX)}
    for name, sig in SIGNALS.items():
        fig, ax = plt.subplots()
        _panel(ax, SPEC, data, verdicts[name], CTX)
        labels = ax.get_legend_handles_labels()[1]
        assert "warm-up (not judged)" in labels, (name, labels)
        assert any(lb.startswith("healthy") for lb in labels), (name, labels)
        assert any(lb.startswith("statistic = ") for lb in labels), (name, labels)
        assert ax.get_xlabel() == "step" and ax.get_ylabel() == sig.unit
        if name == "tasks/min_share":
            assert set(TASKS) <= set(labels)
        plt.close(fig)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    import matplotlib.image

    data = rows()
    out = tmp_path / "p.png"
    plot(out, SPEC, data, evaluate(SPEC, data, CTX), CTX)
    img = matplotlib.image.imread(out)
    assert img.shape[0] > 400 and img.shape[1] > 800


def test_the_table_says_what_each_statistic_is() -> None:
    data = rows()
    table = format_table(SPEC, evaluate(SPEC, data, CTX))
    assert "share of steps that found the batch queue empty" in table
    for sig in SIGNALS.values():
        assert sig.what in table and sig.unit in table


def test_masked_share_fires_on_mostly_masked_contexts_and_not_otherwise() -> None:
    """``context/masked_cells_p95`` is judged over a sequence's filled cells
    (S · (1 - padding p50)): 100 of 128 filled cells lights it, 40 of 128
    (RT-J's masking at 0.5 masks below half) and no masking do not."""
    (sig,) = [s for s in SIGNALS.values() if s.name == "context/masked_cells_p95"]
    ctx = {**CTX, "sequence_length": 256}

    def stat(masked: float) -> float:
        steps = [
            {f"{P}context/masked_cells_p95": masked, f"{P}padding/fraction_p50": 0.5}
            for _ in range(10)
        ]
        return sig.stat(steps, ctx)

    lo, hi = sig.healthy
    assert stat(100.0) == pytest.approx(100 / 128) and stat(100.0) > hi
    assert lo <= stat(40.0) <= hi and stat(0.0) == 0.0


def test_a_host_dependent_signal_passes_lit_or_unlit_and_says_so() -> None:
    """Undeclared, a lit signal is a false positive; listed as
    host-dependent it passes either way, and the report and matrix say so."""
    import dataclasses

    from headwater.diag.verdict import DiagResult, evaluate, format_matrix

    data = rows()
    base = {v.signal: v for v in evaluate(SPEC, data, CTX)}
    lit = next(n for n, v in base.items() if v.lit)
    unlit = next(n for n, v in base.items() if not v.lit)
    assert not base[lit].ok and "false positive" in base[lit].why
    spec = dataclasses.replace(SPEC, host_dependent=frozenset({lit, unlit}))
    got = {v.signal: v for v in evaluate(spec, data, CTX)}
    assert got[lit].ok and got[lit].why == "host-dependent: lit on this host"
    assert got[unlit].ok and got[unlit].why == "host-dependent: unlit on this host"
    others = [n for n in got if n not in (lit, unlit)]
    assert [got[n].ok for n in others] == [base[n].ok for n in others]
    matrix = format_matrix([DiagResult(spec, list(got.values()), Path("run"), [])])
    assert matrix.split("\n")[1].split().count("host") == 2


def test_a_metrics_band_is_stated_once_in_the_metric_table() -> None:
    """Each judged metric's band lives in its metric-table row: the signal
    reads it (and refuses to restate it), the dashboards' panel text and
    the metrics reference write it from the row."""
    from headwater import _native
    from headwater.diag.signals import METRICS, Signal, median
    from headwater.rows import band_text

    judged = {r["key"]: r["healthy"] for r in _native.metric_table() if r["healthy"]}
    on_rows = [s for s in SIGNALS.values() if s.metric in METRICS]
    assert {s.metric for s in on_rows} == set(judged)
    for s in on_rows:
        band = judged[s.metric]
        hi = math.inf if band["hi"] is None else band["hi"]
        assert (s.healthy, s.what, s.unit) == ((band["lo"], hi), band["what"], band["unit"])
    with pytest.raises(ValueError, match="the metric table owns it"):
        Signal(metric="queue/depth_min", rule=median("x"), healthy=(0.0, 1.0))
    with pytest.raises(ValueError, match="needs healthy"):
        Signal(metric="trainer/verdict", rule=median("x"))
    pytest.importorskip("grafana_foundation_sdk")
    from headwater.dashboards.widgets import Q, _timeseries, across

    panel = _timeseries("t", "Depth.", [Q(across("queue/depth_min"), "x")]).build()
    assert panel.description == f"Depth. headwater diag judges `queue/depth_min`: {band_text(judged['queue/depth_min'])}."
    root = Path(__file__).resolve().parents[2]
    reference = (root / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    for band in judged.values():
        assert band_text(band).split(" in [")[0] in reference
