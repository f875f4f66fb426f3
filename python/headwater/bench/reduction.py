"""``python -m headwater.bench.reduction``: the host reduction measured
across local CPU processes on loopback, on a schema from the native metric
table (no database needed)."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from headwater._native import telemetry_schema_for
from headwater.telemetry.collective import Gather, reduce
from headwater.telemetry.loopback import free_port, initialize_loopback
from headwater.telemetry.schema import HISTOGRAM, SUM, Schema

__all__ = ["main"]

# ---------------------------------------------------------------------------
# Synthetic schema and the benchmark
# ---------------------------------------------------------------------------


def _synthetic_drain(schema: Schema, rng: np.random.Generator) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in schema.entries:
        key, red = e["key"], e["reduction"]
        if red == HISTOGRAM:
            n = len(e["edges"])
            counts = rng.integers(0, 5, n).astype(float)
            out.update({f"{key}/bucket_{i:02}": float(c) for i, c in enumerate(counts)})
            finite = [x for x in e["edges"] if math.isfinite(x)]
            mx = float(rng.uniform(0, finite[-1] * 1.5))
            out.update({f"{key}_p50": 0.0, f"{key}_p95": 0.0, f"{key}_max": mx})
        elif red == SUM:
            out[key] = float(rng.integers(0, 50)) if "seconds" not in key else rng.uniform()
        else:
            out[key] = float(rng.uniform(0, 100))
    return out


def _bench_worker(rank: int, world: int, port: int, steps: int, warmup: int) -> None:
    import jax

    initialize_loopback(rank, world, port)
    try:
        schema = Schema(
            telemetry_schema_for([f"task_{c}" for c in "abcdef"], max_hops=3, sequence_length=1024)
        )
        rng = np.random.default_rng(rank)
        drains = [_synthetic_drain(schema, rng) for _ in range(8)]
        packed = [schema.values(d)[0] for d in drains]  # as drain_step_metrics_packed()
        times = []
        for i in range(warmup + steps):
            local = packed[i % len(packed)] if (i + rank) % 7 else np.zeros(0)
            t0 = time.perf_counter()
            out = reduce(local, schema)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
        assert out, "the benchmark drains are never all empty"
        # The numpy side alone (pack, reduce the [world, n] matrix, unpack).
        numpy_times = []
        gathered = np.stack([schema.pack_vector(packed[r % len(packed)]) for r in range(world)])
        for _ in range(steps):
            t0 = time.perf_counter()
            schema.pack_vector(packed[0])
            schema.unpack(schema.reduce_matrix(gathered))
            numpy_times.append(time.perf_counter() - t0)
        # The collective alone (same payload, same program), for comparison.
        gather, vec = Gather.get(), schema.pack_vector(packed[0])
        bare = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            gather.finish(gather.start(vec))
            if i >= warmup:
                bare.append(time.perf_counter() - t0)
        res = {
            "rank": rank,
            "median_ms": statistics.median(times) * 1e3,
            "mean_ms": statistics.fmean(times) * 1e3,
            "p95_ms": float(np.quantile(times, 0.95)) * 1e3,
            "numpy_ms": statistics.median(numpy_times) * 1e3,
            "collective_alone_ms": statistics.median(bare) * 1e3,
            "packed_values": schema.size,
            "reduced_keys": len(schema.reduced_keys),
        }
        print(json.dumps(res), flush=True)
    finally:
        jax.distributed.shutdown()


def _bench(processes: int, steps: int, warmup: int, timeout: float) -> list[dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headwater.bench.reduction",
                "--bench-worker",
                str(r),
                "--processes",
                str(processes),
                "--port",
                str(port),
                "--steps",
                str(steps),
                "--warmup",
                str(warmup),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in range(processes)
    ]
    deadline = time.monotonic() + timeout
    try:
        # A failed worker leaves the others blocked in a collective: stop
        # waiting as soon as one fails.
        while any(p.poll() is None for p in procs):
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad:
                raise RuntimeError(
                    f"bench worker failed ({bad[0].returncode}):\n"
                    + (bad[0].stderr.read() if bad[0].stderr else "")[-4000:]
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench did not finish in {timeout} s")
            time.sleep(0.05)
        results = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"bench worker failed ({p.returncode}):\n{err[-4000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m headwater.bench.reduction",
        description="Benchmark the host-side cross-rank telemetry reduction.",
    )
    ap.add_argument("--bench", action="store_true", help="run the benchmark")
    ap.add_argument("--processes", type=int, default=4, help="JAX CPU processes on loopback")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    ap.add_argument("--json", action="store_true", help="print the per-rank results as JSON")
    ap.add_argument("--bench-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.bench_worker is not None:
        _bench_worker(a.bench_worker, a.processes, a.port, a.steps, a.warmup)
        return 0
    if not a.bench:
        ap.print_help()
        return 2
    res = _bench(a.processes, a.steps, a.warmup, a.timeout)
    if a.json:
        print(json.dumps(res, indent=2))
    worst = max(res, key=lambda r: r["median_ms"])
    print(
        f"host reduction, {a.processes} CPU processes, {res[0]['packed_values']} packed values "
        f"-> {res[0]['reduced_keys']} keys, one collective per step: "
        f"median {worst['median_ms']:.3f} ms, mean {worst['mean_ms']:.3f} ms, "
        f"p95 {worst['p95_ms']:.3f} ms per step (slowest rank, {a.steps} steps); "
        f"numpy pack/reduce/unpack alone {worst['numpy_ms']:.3f} ms, "
        f"the bare collective alone {worst['collective_alone_ms']:.3f} ms (median)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
