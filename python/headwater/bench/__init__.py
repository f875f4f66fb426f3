"""``headwater bench``: sampler throughput, stage times, thread scaling,
handoff latency and memory, all measured in one run on one database or on
a mixture file (see :mod:`headwater.mixture`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from headwater import _native
from headwater.rows import BenchRun


def _handoff_us(db: str | list[str], batch_size: int, seq_len: int, samples: int) -> tuple[float, float]:
    """Median and minimum time of ``next_train_batch()`` when a batch is
    already waiting. The sampler gets one core fewer than the machine so the
    consumer is not timed while competing with the producer it just woke."""
    depth = 2
    times = []
    threads = max(1, (os.cpu_count() or 1) - 1)
    with _native.Sampler(
        db,
        default_batch_size=batch_size,
        default_sequence_length=seq_len,
        num_prefetch=depth,
        num_threads=threads,
    ) as s:
        for _ in range(samples):
            deadline = time.monotonic() + 30
            while s.queue_depth("train") < depth and time.monotonic() < deadline:
                time.sleep(0.002)
            t0 = time.perf_counter()
            batch = s.next_train_batch()
            times.append(time.perf_counter() - t0)
            del batch
    return statistics.median(times) * 1e6, min(times) * 1e6


def _telemetry_ratio(
    path: str | list[str],
    threads: int,
    steps: int,
    warmup: int,
    batch_size: int,
    seq_len: int,
    rounds: int,
    weights: list[float] | None = None,
    page_cache: str = "lazy",
) -> dict[str, float]:
    """Throughput with telemetry on over off, alternating runs in this process
    (best of `rounds` each, so a noisy neighbour does not decide the ratio)."""
    best = {True: 0.0, False: 0.0}
    for _ in range(rounds):
        for on in (True, False):
            r = _native.bench_sampler(
                path, threads, steps, warmup, batch_size, seq_len, telemetry=on,
                database_weights=weights, page_cache=page_cache,
            )
            best[on] = max(best[on], r["batches_per_s"])
    return {
        "on_batches_per_s": best[True],
        "off_batches_per_s": best[False],
        "ratio_on_over_off": best[True] / best[False],
    }


def _packing_comparison(
    path: str | list[str],
    threads: int,
    steps: int,
    warmup: int,
    batch_size: int,
    seq_len: int,
    factors: list[int],
    rounds: int,
    page_cache: str = "lazy",
) -> dict[str, Any]:
    """Unpacked against ``pack=True`` at each of ``factors``, runs alternating
    in this process (best of ``rounds`` each, so load drift hits every
    configuration alike); ratios are against the unpacked run."""
    configs: list[tuple[str, bool, int]] = [("unpacked", False, 1)]
    configs += [(f"pack_factor={f or 'auto'}", True, f) for f in factors]
    best: dict[str, BenchRun] = {}
    for _ in range(rounds):
        for name, pack, factor in configs:
            r = _native.bench_sampler(
                path, threads, steps, warmup, batch_size, seq_len, pack=pack, pack_factor=factor,
                page_cache=page_cache,
            )
            if name not in best or r["cells_per_s"] > best[name]["cells_per_s"]:
                best[name] = r
    base = best["unpacked"]
    return {
        name: {
            "padding": 1.0 - r["fill"],
            "useful_cells_per_s": r["cells_per_s"],
            "batches_per_s": r["batches_per_s"],
            "seeds_per_s": r["seeds_per_s"],
            "contexts_cut": r["contexts_cut"],
            "seeds_per_sequence": r["seeds_per_s"] / r["batches_per_s"] / batch_size,
            "useful_cells_ratio": r["cells_per_s"] / base["cells_per_s"],
            "batches_ratio": r["batches_per_s"] / base["batches_per_s"],
        }
        for name, r in best.items()
    }


_WINDOW_CHILD = (
    "import json, sys\n"
    "from headwater import _native\n"
    "a = json.loads(sys.argv[1])\n"
    "a['window'] = tuple(a['window'])\n"
    "print(json.dumps(_native.bench_sampler(**a)))\n"
)


def _window_runs(n: int, args: dict[str, Any], seconds: float, margin: float) -> list[dict[str, Any]]:
    """``n`` processes, each running ``bench_sampler(**args)`` on one thread
    and counting the batches it finishes in the same wall-clock window of
    ``seconds``, which opens ``margin`` seconds from now (time to start,
    open and warm up). Started and, on any failure, killed by PID."""
    start = time.time() + margin
    a = dict(args, threads=1, steps=0, window=[start, start + seconds])
    env = dict(os.environ)
    # The children import this very package, wherever it was imported from.
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WINDOW_CHILD, json.dumps(a)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for _ in range(n)
    ]
    try:
        outs = [p.communicate(timeout=margin + seconds + 300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    runs = []
    for p, (out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            last = (err.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"bench process {p.pid} exited with {p.returncode}: {last}")
        runs.append(json.loads(out))
    return runs


def _process_scaling(
    path: str | list[str],
    procs: int,
    seconds: float,
    margin: float,
    args: dict[str, Any],
    rounds: int,
) -> dict[str, Any]:
    """One one-thread process alone, then ``procs`` of them at once, each
    counting the batches it finishes in the same wall-clock window: how
    this machine scales this workload with nothing shared between the
    workers (no threads, no queues, each its own allocator and scratch),
    the reference for the thread scaling. Alone and together alternate
    ``rounds`` times and the best of each is kept (a noisy neighbour only
    ever slows a window down)."""
    a = dict(args, db_path=path)
    alone = 0.0
    together: list[float] = []
    for _ in range(max(rounds, 1)):
        alone = max(alone, _window_runs(1, a, seconds, margin)[0]["batches_per_s"])
        each = [r["batches_per_s"] for r in _window_runs(procs, a, seconds, margin)]
        if sum(each) > sum(together):
            together = each
    total = sum(together)
    return {
        "processes": procs,
        "seconds": seconds,
        "rounds": max(rounds, 1),
        "alone_batches_per_s": alone,
        "together_batches_per_s": total,
        "per_process_batches_per_s": together,
        "ratio": total / alone,
    }


def _train_comparison(
    path: str | list[str], batch_size: int, seq_len: int, factors: list[int], steps: int,
    seeds: int, overrides: list[str],
) -> dict[str, Any]:
    from headwater.bench.packing import train_comparison

    if not isinstance(path, str):
        raise ValueError("the training comparison takes one database, not a mixture")
    return train_comparison(path, batch_size, seq_len, factors, steps, seeds, overrides=overrides)


def _process_scaling_of(
    runs: list[BenchRun], path: str | list[str], threads: list[int], steps: int,
    conditions: dict[str, Any], rounds: int,
) -> dict[str, Any]:
    """:func:`_process_scaling` over a window as long as ``steps`` batches of
    the one-thread run (``runs``' fewest threads), ``conditions`` the
    sampler's keys for each process."""
    one = min(runs, key=lambda r: r["threads"])
    rate = one["batches_per_s"] / one["threads"]
    # Long enough for `steps` batches at one thread's rate; the window
    # opens once every process has had several times this run's
    # opening and warm-up (plus the interpreter's start) to get there.
    ready = one["first_batch_seconds"] + conditions["warmup"] / rate
    return _process_scaling(
        path,
        max(threads),
        max(steps / rate, 0.5),
        2.0 + 3 * ready * max(threads),
        conditions,
        rounds,
    )


def _runs_summary(
    db: str | os.PathLike[str], paths: list[str], runs: list[BenchRun], steps: int,
    warmup: int, batch_size: int, seq_len: int, ncpu: int, page_cache: str,
) -> dict[str, Any]:
    """The head of :func:`run_bench`'s result: the database, the conditions,
    the thread runs, the best rate and the scaling against the first run."""
    base = runs[0]
    best = max(runs, key=lambda r: r["batches_per_s"])
    return {
        "db": str(Path(db).resolve()),
        "databases": len(paths),
        "db_bytes": sum(_native.Database(p).bytes_on_disk for p in paths),
        "conditions": {
            "batch_size": batch_size,
            "sequence_length": seq_len,
            "steps": steps,
            "warmup": warmup,
            "cpus": ncpu,
            "page_cache": page_cache,
        },
        "runs": runs,
        "batches_per_s": best["batches_per_s"],
        "batches_per_s_per_core": base["batches_per_s"] / base["threads"],
        "scaling": {
            f"{r['threads']}/{base['threads']}": r["batches_per_s"] / base["batches_per_s"]
            for r in runs
        },
    }


def run_bench(
    db: str | os.PathLike[str] | None = None,
    batch_size: int = 32,
    seq_len: int = 1024,
    threads: list[int] | None = None,
    steps: int = 200,
    warmup: int = 20,
    handoff_samples: int = 30,
    telemetry: str = "on",
    pack_factors: list[int] | None = None,
    rounds: int = 3,
    page_cache: str = "lazy",
    process_scaling: bool = False,
    train_steps: int = 0,
    train_seeds: int = 1,
    train_overrides: list[str] | None = None,
    sampler_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure everything in one run; returns a JSON-able dict.

    ``telemetry``: ``on`` / ``off`` for the main runs, or ``both`` to also
    measure the on/off throughput ratio (alternating runs, best of three).
    ``pack_factors``: also compare unpacked with ``pack=True`` at each factor
    (useful cells/s, batches/s, padding; alternating runs, best of
    ``rounds``) on the largest thread count. ``page_cache``: the sampler key
    of that name for every run (``populate`` reads the database in, as huge
    pages where the kernel allows, before each run is timed).
    ``process_scaling``: also run one one-thread process alone and then as
    many as the largest thread count at once, over the same wall-clock
    window (as long as a one-thread run of ``steps``), alternating, best of
    ``rounds`` each: the machine's own scaling of this workload, which the
    thread scaling is read against.
    ``train_steps``: also train the model unpacked and at each of
    ``pack_factors`` for that many steps from ``train_seeds`` seeds
    (:mod:`headwater.bench.packing`: useful cells/s of the model and
    evaluation metrics at equal steps); ``train_overrides`` are ``headwater
    train --set`` values for those runs. ``sampler_overrides``: sampler
    keys set in the thread-count runs (e.g. :func:`examples_recipe`).
    """
    _check_bench_args(telemetry, train_steps, pack_factors)
    db, path, weights = _bench_source(db)
    paths = [path] if isinstance(path, str) else path
    ncpu = os.cpu_count() or 1
    threads = threads or sorted({1, ncpu})
    on = telemetry != "off"
    runs = _thread_runs(path, threads, steps, warmup, batch_size, seq_len, on, weights, page_cache, sampler_overrides)
    handoff, handoff_min = _handoff_us(path, batch_size, seq_len, handoff_samples)
    conditions = {
        "warmup": warmup, "batch_size": batch_size, "sequence_length": seq_len, "telemetry": on,
        "database_weights": weights, "page_cache": page_cache,
    }
    procs = _process_scaling_of(runs, path, threads, steps, conditions, rounds) if process_scaling else None
    # In the result's order: the peak RSS is read before the comparisons run.
    head = _runs_summary(db, paths, runs, steps, warmup, batch_size, seq_len, ncpu, page_cache)
    peak_rss = _native.peak_rss_bytes()
    packing = None
    if pack_factors:
        packing = _packing_comparison(
            path, max(threads), steps, warmup, batch_size, seq_len, pack_factors, rounds, page_cache
        )
    training = None
    if train_steps:
        training = _train_comparison(
            path, batch_size, seq_len, pack_factors or [], train_steps, train_seeds,
            train_overrides or [],
        )
    load = os.getloadavg()
    cost = None
    if telemetry == "both":
        cost = _telemetry_ratio(
            path, max(threads), steps, warmup, batch_size, seq_len, 3, weights, page_cache
        )
    return {
        **head, "handoff_us_median": handoff, "handoff_us_min": handoff_min,
        "peak_rss_bytes": peak_rss, "telemetry": telemetry, "packing": packing,
        "process_scaling": procs, "training": training, "load_average": load,
        "telemetry_cost": cost, "sampler_overrides": sampler_overrides,
    }


def _thread_runs(
    path: str | list[str], threads: list[int], steps: int, warmup: int, batch_size: int,
    seq_len: int, telemetry: bool, weights: Any, page_cache: str,
    overrides: dict[str, Any] | None = None,
) -> list[BenchRun]:
    """One :func:`_native.bench_sampler` run per thread count, in order."""
    text = json.dumps(overrides) if overrides else None
    return [
        _native.bench_sampler(
            path, t, steps, warmup, batch_size, seq_len, telemetry=telemetry,
            database_weights=weights, page_cache=page_cache, sampler_overrides=text,
        )
        for t in threads
    ]


# RT-J's pretraining recipe (expts/pretrain/submit.py of
# rishabh-ranjan/relational-transformer): its lists, walks and masking bound.
RTJ_LOCAL_SIZES = (256, 512, 1024, 2048, 4096, 8192)
RTJ_BFS_WIDTHS = (8, 16, 32, 64, 128, 256)


def examples_recipe(path: str | list[str], seq_len: int) -> dict[str, Any]:
    """Sampler keys of RT-J's in-context pretraining recipe at ``S =
    seq_len``: its local sizes up to ``S`` (RT-J drops the larger ones per
    sequence the same way), its widths up to ``S``, both recencies, 10,000
    walks of 20 rows, ``mask_prob_max`` 0.5 (cells masked as extra targets),
    and weight 0 for query tasks without a label window (their examples
    need one: docs/contexts.md, "Forecast tasks")."""
    from headwater._native import Database

    query: dict[str, float] = {}
    for p in [path] if isinstance(path, str) else path:
        m = json.loads(Database(p).metadata_json())
        for t in m["tasks"]:
            col = m["columns"][t["target_column"]]
            query_task = col["table"] != t["anchor_table"] or col.get("slot") is None
            if query_task and t.get("window_us") is None:
                query[t["name"] if isinstance(path, str) else f"{Path(p).name}/{t['name']}"] = 0.0
    return {
        "examples": True,
        "local_context_sizes": [n for n in RTJ_LOCAL_SIZES if n <= seq_len],
        "bfs_widths": [n for n in RTJ_BFS_WIDTHS if n <= seq_len],
        "prefer_latest": [False, True],
        "num_walks": 10_000,
        "walk_length": 20,
        "mask_prob_max": 0.5,
        "task_weights": query or None,
    }


def run_ranker_recall(
    db: str | os.PathLike[str] | None, seeds: int, ranker: str, batch_size: int,
    sampler_overrides: dict[str, Any], same_key: bool = False,
) -> dict[str, Any]:
    """recall@k of ``ranker`` against the ``walks`` ranker per task with
    examples (``_native.ranker_recall``: ``seeds`` seeds each, one thread),
    the ceiling (an independent ``walks`` run), and each ranker's context
    builds per CPU-second with their batches of ``batch_size`` (builds
    only: no assembly)."""
    _, path, _ = _bench_source(db)
    tasks = _native.ranker_recall(path, seeds, ranker, same_key, json.dumps(sampler_overrides))
    for t in tasks:
        t["batches_per_cpu_s"] = t["contexts_per_cpu_s"] / batch_size
        t["walks_batches_per_cpu_s"] = t["walks_contexts_per_cpu_s"] / batch_size
    return {
        "db": str(db) if db is not None else str(path), "ranker": ranker, "seeds": seeds,
        "same_key": same_key, "batch_size": batch_size, "sampler_overrides": sampler_overrides,
        "load_average": os.getloadavg(), "tasks": tasks,
    }


def _check_bench_args(telemetry: str, train_steps: int, pack_factors: list[int] | None) -> None:
    if train_steps and not pack_factors:
        raise ValueError("train_steps needs pack_factors: the comparison is unpacked against packed")
    if telemetry not in ("on", "off", "both"):
        raise ValueError(f"telemetry must be 'on', 'off' or 'both', got {telemetry!r}")


def _bench_source(db: str | os.PathLike[str] | None) -> tuple[Any, str | list[str], Any]:
    """``(db, sampler path(s), database weights)``: ``db`` or the default
    database, a mixture file resolved to its databases and weights."""
    if db is None:
        from headwater.data.default_db import default_database

        db = default_database()
    from headwater.inspection import require_exists
    from headwater.mixture import sampler_source

    require_exists(db)
    path, keys = sampler_source(db)
    return db, path, keys.get("database_weights")


def format_bench(r: dict[str, Any]) -> str:
    c = r["conditions"]
    lines = [
        f"database   {r['db']}  ({r.get('databases', 1)} database(s), {r['db_bytes'] / 2**20:.1f} MiB mapped)",
        f"batch      B={c['batch_size']} S={c['sequence_length']}  {c['steps']} steps after {c['warmup']} warm-up, {c['cpus']} CPUs, page cache {c.get('page_cache', 'lazy')}",
        *([f"sampler    {json.dumps(r['sampler_overrides'])}"] if r.get("sampler_overrides") else []),
        "",
        f"{'threads':>7} {'batches/s':>10} {'useful Mc/s':>11} {'fill':>6} {'bfs ms':>8} {'asm ms':>8} {'text ms':>8} {'total ms':>9}",
    ]
    for x in r["runs"]:
        lines.append(
            f"{x['threads']:>7} {x['batches_per_s']:>10.1f} {x['cells_per_s'] / 1e6:>11.2f} {x['fill']:>6.1%} "
            f"{x['bfs_ms']:>8.3f} {x['assemble_ms']:>8.3f} {x['collate_ms']:>8.3f} {x['total_ms']:>9.3f}"
        )
    lines += [
        "",
        f"steady state     {r['batches_per_s']:.1f} batches/s ({r['batches_per_s_per_core']:.1f} per core at 1 thread)",
        "scaling          " + ", ".join(f"{k}: {v:.2f}x" for k, v in r["scaling"].items()),
        (
            f"handoff          {r['handoff_us_median']:.1f} µs median, "
            f"{r['handoff_us_min']:.1f} µs min (next_train_batch with a batch ready)"
        ),
        f"peak RSS         {(r['peak_rss_bytes'] or 0) / 2**20:.1f} MiB",
        (
            f"first batch      {r['runs'][0]['first_batch_seconds']:.3f} s from open; telemetry "
            f"{r['runs'][0]['telemetry_us']:.2f} µs/batch record + drain of "
            f"{r['runs'][0]['drained_values']} values"
        ),
    ]
    ps = r.get("process_scaling")
    if ps:
        n = ps["processes"]
        threads = r["scaling"].get(f"{n}/1")
        reach = f"; {n} threads reach {threads / ps['ratio']:.0%} of it" if threads else ""
        lines.insert(
            lines.index(next(x for x in lines if x.startswith("scaling"))) + 1,
            f"processes        {n} one-thread processes at once: {ps['ratio']:.2f}x one alone "
            f"({ps['alone_batches_per_s']:.1f} -> {ps['together_batches_per_s']:.1f} batches/s, "
            f"same {ps['seconds']:.1f} s window, best of {ps['rounds']}){reach}",
        )
    tc = r.get("telemetry_cost")
    if tc:
        lines.append(
            f"telemetry        on {tc['on_batches_per_s']:.1f} / off {tc['off_batches_per_s']:.1f} "
            f"batches/s = {tc['ratio_on_over_off']:.3f}x"
        )
    pk = r.get("packing")
    if pk:
        lines += [
            "",
            f"{'packing':<17} {'padding':>8} {'useful Mc/s':>11} {'x':>6} {'batches/s':>10} {'x':>6} {'cut':>6} "
            f"{'seeds/seq':>9}",
        ]
        for name, x in pk.items():
            lines.append(
                f"{name:<17} {x['padding']:>8.1%} {x['useful_cells_per_s'] / 1e6:>11.2f} "
                f"{x['useful_cells_ratio']:>6.2f} {x['batches_per_s']:>10.1f} {x['batches_ratio']:>6.2f} "
                f"{x['contexts_cut']:>6.1%} {x['seeds_per_sequence']:>9.2f}"
            )
    if r.get("training"):
        from headwater.bench.packing import format_train_comparison

        lines += format_train_comparison(r["training"])
    lines.append(f"load average     {' '.join(f'{v:.1f}' for v in r['load_average'])}")
    return "\n".join(lines)
