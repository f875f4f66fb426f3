"""Draw the benchmark pages' figures from their recorded numbers.

Reads ``docs/benchmarks/data/*.json`` (each file says where its figures come
from: date, machine, commit, command) and writes one PNG per figure into
``docs/benchmarks/img/`` (or ``--out``). The pages embed the PNGs; the JSON is
the record, the plot only draws it. Usage, from the repository root::

    python scripts/plot_benchmarks.py [--out DIR]

Needs matplotlib (a test dependency). ``FIGURES`` lists every PNG and the
function that draws it; ``tests/python/test_docs.py`` draws them all into a
scratch folder and checks every image a page shows is among them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
Data = dict[str, Any]


def _load(name: str) -> Data:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def _mid(v: float | Sequence[float]) -> float:
    return float(v) if isinstance(v, int | float) else sum(v) / len(v)


def _err(v: float | Sequence[float]) -> tuple[float, float]:
    """(below, above) the midpoint, for a recorded range."""
    if isinstance(v, int | float):
        return 0.0, 0.0
    m = _mid(v)
    return m - min(v), max(v) - m


def _bars(ax: Axes, labels: Sequence[str], series: dict[str, Sequence[Any]]) -> None:
    """Grouped bars; a value may be a number or a recorded range (drawn as
    its midpoint with the range as an error bar)."""
    n = len(series)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        errs = list(zip(*[_err(v) for v in values], strict=True))
        ranged = any(e != (0.0, 0.0) for e in zip(*errs, strict=True))
        ax.bar(
            xs,
            [_mid(v) for v in values],
            width,
            label=name,
            yerr=errs if ranged else None,
            capsize=3,
        )
    ax.set_xticks(range(len(labels)), labels)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _figure(d: Data, ncols: int = 1, width: float = 7.0) -> tuple[Figure, list[Axes]]:
    fig, axes = plt.subplots(1, ncols, figsize=(width, 3.8), squeeze=False)
    fig.text(0.01, 0.01, f"{d['date']} · {d['machine']}"[:140], fontsize=6, color="0.4")
    return fig, list(axes[0])


# ----------------------------------------------------------------------------
# One function per figure
# ----------------------------------------------------------------------------


def hot_path() -> Figure:
    d = _load("2026-11-23-hot-path")
    rows = d["throughput"]
    fig, (ax,) = _figure(d)
    _bars(
        ax,
        [r["database"] for r in rows],
        {
            "before, 1 thread": [r["before_1"] for r in rows],
            "after, 1 thread": [r["after_1"] for r in rows],
            "before, 2 threads": [r["before_2"] for r in rows],
            "after, 2 threads": [r["after_2"] for r in rows],
        },
    )
    ax.set_ylabel("batches/s (best of 3)")
    ax.set_title("Hot path: before (d9a83fb) and after", fontsize=10)
    return fig


def hot_path_perf() -> Figure:
    d = _load("2026-11-23-hot-path")
    rows = d["perf_share_percent"]["rows"]
    fig, (ax,) = _figure(d)
    _bars(
        ax,
        [r["what"].replace(" ", "\n", 1) for r in rows],
        {"before": [r["before"] for r in rows], "after": [r["after"] for r in rows]},
    )
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("% of samples (perf, 1 thread)")
    ax.set_title("Where one thread's time goes, SF 0.1 MiniLM", fontsize=10)
    return fig


def bfs_prefetch() -> Figure:
    d = _load("2026-11-24-bfs-prefetch")
    rows = d["prefetch"]["rows"]
    fig, (ax,) = _figure(d)
    labels = [f"{r['database']}\n{t} thread{'s' if t == '2' else ''}" for r in rows for t in "12"]
    _bars(
        ax,
        labels,
        {
            "before (bdeb47f)": [r[f"before_{t}"] for r in rows for t in "12"],
            "after (BFS prefetch)": [r[f"after_{t}"] for r in rows for t in "12"],
        },
    )
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("batches/s (mean of 3 rounds, bar = range)")
    ax.set_title("Prefetching the BFS's next reads", fontsize=10)
    return fig


def remeasured() -> Figure:
    d = _load("2026-11-24-bfs-prefetch")
    rows = d["remeasured"]["rows"]
    fig, (ax,) = _figure(d)
    _bars(
        ax,
        [f"round {r['round']}" for r in rows],
        {
            "SF 0.1, 1 thread": [r["sf01_1"] for r in rows],
            "SF 0.1, 2 threads": [r["sf01_2"] for r in rows],
            "SF 1, 1 thread": [r["sf1_1"] for r in rows],
            "SF 1, 2 threads": [r["sf1_2"] for r in rows],
        },
    )
    ax.axhline(1000, color="0.3", ls="--", lw=1)
    ax.set_ylabel("batches/s (--page-cache populate)")
    ax.set_title("Re-measured in a quiet phase (dashed: 1,000 batches/s)", fontsize=10)
    return fig


def process_scaling() -> Figure:
    d = _load("2026-11-24-bfs-prefetch")
    rows = d["process_scaling"]["rows"]
    fig, (ax,) = _figure(d)
    _bars(
        ax,
        ["\n".join(r["run"].rsplit(" ", 1)) for r in rows],
        {
            "2 threads / 1 thread": [r["threads_2"] / r["threads_1"] for r in rows],
            "2 processes / 1 alone": [r["processes_together"] / r["process_alone"] for r in rows],
        },
    )
    ax.axhline(2.0, color="0.3", ls="--", lw=1)
    ax.set_ylim(1.0, 2.3)
    ax.set_ylabel("speed-up on 2 vCPUs")
    ax.set_title("Threads against the machine's own two-process scaling", fontsize=10)
    return fig


def packing_sampler() -> Figure:
    d = _load("2026-11-26-packing")
    s = d["sampler"]
    rows = s["rows"]
    labels = [r["config"] for r in rows]
    fig, (a, b) = _figure(d, ncols=2, width=9.0)
    prev = s["previous_placement_padding_percent"]
    _bars(
        a,
        labels,
        {
            "previous placement": [prev.get(c, float("nan")) for c in labels],
            "before prefix cuts (a397a90)": [r["padding_before"] for r in rows],
            "after": [r["padding_after"] for r in rows],
        },
    )
    a.set_ylabel("padding, % of cells")
    a.set_xlabel("pack_factor")
    a.set_title("Padding", fontsize=10)
    _bars(
        b,
        labels,
        {
            "useful cells/s, before": [r["useful_x_before"] for r in rows],
            "useful cells/s, after": [r["useful_x_after"] for r in rows],
            "batches/s, after": [r["batches_x_after"] for r in rows],
        },
    )
    b.axhline(1.0, color="0.3", ls="--", lw=1)
    b.set_ylabel("× unpacked (two invocations)")
    b.set_xlabel("pack_factor")
    b.set_title("The sampler's rates", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def packing_training() -> Figure:
    d = _load("2026-11-26-packing")
    t = d["training"]
    fig, (a, b) = _figure(d, ncols=2, width=9.0)
    _bars(
        a,
        [r["config"] for r in t["rows"]],
        {"useful cells/s of the model": [r["range"] for r in t["rows"]]},
    )
    a.set_ylabel("useful cells/s (median, range over seeds)")
    a.set_title("Training on CPU, B = 2, S = 1024", fontsize=10)
    per_seed = t["val_loss_per_seed"]
    _bars(b, [f"seed {i}" for i in range(len(per_seed["unpacked"]))], per_seed)
    b.set_ylabel("val loss at step 300")
    b.set_title("Validation loss per seed", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def mixtures() -> Figure:
    d = _load("2026-11-23-mixtures")
    rows = d["rows"]
    fig, (ax,) = _figure(d)
    _bars(
        ax,
        [r["source"].replace(" ", "\n", 2) for r in rows],
        {"batches/s": [r["batches_per_s"] for r in rows]},
    )
    ax.axhline(d["harmonic_mean_of_members"], color="0.3", ls="--", lw=1)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("batches/s, 1 thread (best of 3)")
    ax.set_title("Mixtures (dashed: the three members' harmonic mean)", fontsize=10)
    return fig


def gpu() -> Figure:
    d = _load("2026-11-23-gpu")
    fig, (ax,) = _figure(d)
    sync = d["synchronous"]
    asyn = [r for r in d["asynchronous"]["rows"] if not r["profile"]]
    ax.plot(
        [r["B"] for r in sync], [r["median_step_ms"] for r in sync], "o-", label="synchronous loop"
    )
    ax.plot(
        [r["B"] for r in asyn], [r["median_step_ms"] for r in asyn], "s-", label="asynchronous loop"
    )
    for r in sync:
        ax.annotate(
            f"wait {r['data_wait_percent']} %",
            (r["B"], r["median_step_ms"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(4, -10),
        )
    ax.set_xlabel("B (sequences of S = 1024 per step)")
    ax.set_ylabel("median step, ms")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("One H100, one sampler process: step time and data wait", fontsize=10)
    return fig


def preprocessing_memory() -> Figure:
    d = _load("2026-11-23-preprocessing-memory")
    fig, (a, b) = _figure(d, ncols=2, width=9.0)
    for name, values in d["peak_rss_mib"].items():
        if name != "note":
            a.plot(d["phases"], values, "o-", label=name)
    a.set_ylabel("peak RSS (VmRSS), MiB")
    a.set_title("SF 1: resident per phase", fontsize=10)
    for name, values in d["private_mib"].items():
        if name != "note":
            b.plot(d["phases"], values, "o-", label=name)
    b.set_ylabel("private (RssAnon), MiB")
    b.set_title("SF 1: private per phase", fontsize=10)
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def sf10_phases() -> Figure:
    d = _load("2026-11-24-scale")
    p = d["preprocess_phases"]
    fig, (ax,) = _figure(d)
    for phase, values in p["private_mib"].items():
        ax.plot(range(len(values)), values, "o-", label=phase)
    ax.set_xticks(range(len(p["versions"])), [v.replace(", ", ",\n") for v in p["versions"]])
    ax.tick_params(axis="x", labelsize=7)
    ax.axhline(2048, color="0.3", ls="--", lw=1)
    ax.set_ylabel("private memory (RssAnon), MiB")
    ax.set_title(
        "Preprocessing SF 10 (87 M rows): private memory per phase, by code version\n"
        "(dashed: the 2 GiB budget)",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def scale_sampling() -> Figure:
    d = _load("2026-11-24-scale")
    rows = d["sampling_by_scale"]["rows"]
    fig, (a, b) = _figure(d, ncols=2, width=9.0)
    x = [r["rows_m"] for r in rows]
    a.plot(x, [r["threads_1"] for r in rows], "o-", label="1 thread")
    a.plot(x, [r["threads_2"] for r in rows], "s-", label="2 threads")
    a.set_ylabel("batches/s")
    for key, label in (("bfs_ms", "BFS"), ("assembly_ms", "assembly"), ("total_ms", "total")):
        b.plot(x, [r[key] for r in rows], "o-", label=label)
    b.set_ylabel("ms per batch, 1 thread")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("rows (millions): SF 0.1, 1, 10")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    a.set_title("Sampling rate by database size (2026-11-23)", fontsize=10)
    b.set_title("Stage cost by database size", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def huge_pages() -> Figure:
    d = _load("2026-11-24-scale")
    rows = d["huge_pages"]["rows"]
    fig, (ax,) = _figure(d)
    _bars(
        ax,
        ["SF 1", "SF 10"],
        {r["mode"]: [r["sf1"], r["sf10"]] for r in rows},
    )
    ax.set_ylabel("batches/s, 1 thread (mean of 3 rounds, bar = range)")
    ax.set_title("Huge pages: --page-cache lazy against populate", fontsize=10)
    return fig


def random_access() -> Figure:
    d = _load("2026-11-24-scale")
    rows = d["random_access"]["rows"]
    sf1 = next(r for r in rows if r["database"] == "SF 1")
    fig, (ax,) = _figure(d)
    x = [r["mapped_gib"] for r in rows]
    for key, label in (
        ("random_read_ns", "one dependent random read"),
        ("sampler_ms", "sampler, ms per batch"),
        ("bfs_ms", "BFS stage"),
        ("assembly_ms", "assembly stage"),
    ):
        base = _mid(sf1[key])
        ys = [_mid(r[key]) / base for r in rows]
        errs = list(zip(*[tuple(e / base for e in _err(r[key])) for r in rows], strict=True))
        ax.errorbar(x, ys, yerr=errs, fmt="o-", capsize=3, label=label)
    for r in rows:
        ax.annotate(r["database"], (r["mapped_gib"], 0.8), fontsize=7, ha="center")
    ax.set_xscale("log")
    ax.set_xlabel("database mapped, GiB (2 MiB pages)")
    ax.set_ylabel("× SF 1")
    ax.axhline(1.2, color="0.3", ls="--", lw=1)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(
        "SF 0.1 → SF 10: the sampler's cost follows the machine's read latency\n"
        "(dashed: 20 % over SF 1)",
        fontsize=9,
    )
    return fig


def memory_fraction() -> Figure:
    d = _load("2026-11-28-memory")
    rows = d["sweep"]["rows"]
    fig, (ax,) = _figure(d)
    x = [r["memory_fraction"] for r in rows]
    for key, label in (("before", "before: 256 KiB blocks, read-ahead"),
                       ("after", "after: 4 KiB blocks, no read-ahead over the budget")):
        ax.plot(x, [r[key] for r in rows], "o-", label=label)
    ax.axhline(d["sweep"]["in_memory_batches_per_s"] * 0.25, color="0.3", ls="--", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("memory limit / database size (TPC-H SF 1, 1.3 GB)")
    ax.set_ylabel("batches/s, one thread")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(
        "A database larger than its memory cgroup\n(dashed: the goal, 25 % of the in-memory rate)",
        fontsize=9,
    )
    return fig


def locality() -> Figure:
    d = _load("2026-11-28-locality")
    fig, (ax,) = _figure(d)
    size = d["database_bytes"]
    for key, label, style in (
        ("source_orders", "source order, tasks on orders", "o--"),
        ("locality_orders", "locality order + seed_windows, tasks on orders", "o-"),
        ("source_all", "source order, all five tasks", "s--"),
        ("locality_all", "locality order + seed_windows, all five tasks", "s-"),
    ):
        runs = [r for r in d[key]["runs"] if r["memory_limit_bytes"]]
        ax.plot([r["memory_limit_bytes"] / size for r in runs],
                [r["best_batches_per_s"] for r in runs], style, label=label)
    unlimited = next(r for r in d["locality_orders"]["runs"] if not r["memory_limit_bytes"])
    ax.axhline(unlimited["best_batches_per_s"] * 0.25, color="0.3", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("memory limit / database size (TPC-H SF 1, 1.37 GB)")
    ax.set_ylabel("batches/s, one thread")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("Locality: a row order and seed windows\n(dotted: 25 % of the in-memory rate)",
                 fontsize=9)
    return fig


def corpus() -> Figure:
    d = _load("2026-11-29-corpus")
    fig, (ax,) = _figure(d)
    size = d["corpus_bytes"]
    for key, label, style in (
        ("no_hot_sets", "no hot sets", "o--"),
        ("hot_sets", "hot_set_bytes 100 MiB, hot_set_steps 1000", "o-"),
    ):
        runs = [r for r in d[key]["runs"] if r["memory_limit_bytes"]]
        ax.plot([r["memory_limit_bytes"] / size for r in runs],
                [r["best_batches_per_s"] for r in runs], style, label=label)
    unlimited = next(r for r in d["hot_sets"]["runs"] if not r["memory_limit_bytes"])
    ax.axhline(unlimited["best_batches_per_s"], color="0.3", ls="-", lw=1, label="no memory limit")
    ax.axhline(unlimited["best_batches_per_s"] * 0.7, color="0.3", ls=":", lw=1,
               label="70 % of the in-memory rate")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"memory limit / corpus size (200 generated databases, {size / 1e9:.2f} GB)")
    ax.set_ylabel("batches/s, one thread (RT-J's recipe)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("A corpus larger than memory: hot sets\n(in context, task_mixing = sequence)",
                 fontsize=9)
    return fig


#: Every figure: PNG name → the function that draws it.
FIGURES: dict[str, Callable[[], Figure]] = {
    "hot-path.png": hot_path,
    "hot-path-perf.png": hot_path_perf,
    "bfs-prefetch.png": bfs_prefetch,
    "remeasured.png": remeasured,
    "process-scaling.png": process_scaling,
    "packing-sampler.png": packing_sampler,
    "packing-training.png": packing_training,
    "mixtures.png": mixtures,
    "gpu.png": gpu,
    "preprocessing-memory.png": preprocessing_memory,
    "sf10-phases.png": sf10_phases,
    "scale-sampling.png": scale_sampling,
    "huge-pages.png": huge_pages,
    "random-access.png": random_access,
    "memory-fraction.png": memory_fraction,
    "locality.png": locality,
    "corpus.png": corpus,
}


def draw(out: Path) -> list[Path]:
    """Draw every figure into ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in FIGURES.items():
        fig = make()
        fig.tight_layout(rect=(0, 0.04, 1, 1))  # room for the date/machine footer
        path = out / name
        # No timestamp or version in the file, so a redraw of unchanged data
        # does not churn the committed PNG on the same matplotlib.
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "img")
    a = p.parse_args(argv)
    for path in draw(a.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
