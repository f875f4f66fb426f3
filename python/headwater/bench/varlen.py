"""``headwater bench --sequence-lengths 512,…,8192 --tokens-per-batch 131072``:
sampler throughput of variable length (each step draws its ``S`` from the
list and has ``B = tokens / S`` sequences) beside a fixed ``S`` (``--seq-len``)
at the same token budget, runs alternating in this process so load drift
hits both alike (best of ``--rounds`` each; every round is kept in the
output). Rates are sequence positions (``B·S``, the budget delivered) per
wall second and per process CPU second, with the load average before and
after: docs/sampling.md, "Variable length".
"""

from __future__ import annotations

import json
import os
from typing import Any

from headwater import _native


def run_varlen_bench(
    db: Any,
    lengths: list[int],
    tokens: int,
    fixed_len: int,
    threads: int,
    steps: int,
    warmup: int,
    rounds: int,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The interleaved comparison as one JSON-able dict (see the module doc)."""
    from headwater.bench import _bench_source

    db, path, weights = _bench_source(db)
    if tokens % fixed_len:
        raise ValueError(
            f"--tokens-per-batch {tokens} is not a multiple of --seq-len {fixed_len} "
            "(the fixed run's B = tokens / S)"
        )
    base = dict(overrides or {})
    configs = {
        "fixed": base,
        "variable": {**base, "sequence_lengths": lengths, "tokens_per_batch": tokens},
    }
    load_before = os.getloadavg()
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, over in configs.items():
            r = _native.bench_sampler(
                path,
                threads,
                steps,
                warmup,
                tokens // fixed_len,
                fixed_len,
                database_weights=weights,
                sampler_overrides=json.dumps(over) if over else None,
            )
            seen[name].append(dict(r))
    best = {n: max(rs, key=lambda r: r["tokens_per_s"]) for n, rs in seen.items()}
    best_cpu = {n: max(r["tokens_per_cpu_s"] for r in rs) for n, rs in seen.items()}
    keep = ("tokens_per_s", "tokens_per_cpu_s", "batches_per_s", "cells_per_s", "fill", "total_ms")
    return {
        "db": str(db),
        "conditions": {
            "sequence_lengths": lengths,
            "tokens_per_batch": tokens,
            "fixed_sequence_length": fixed_len,
            "fixed_batch_size": tokens // fixed_len,
            "threads": threads,
            "steps": steps,
            "warmup": warmup,
            "rounds": rounds,
            "cpus": os.cpu_count(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
            "sampler_overrides": base,
        },
        "runs": {n: [{k: r[k] for k in keep} for r in rs] for n, rs in seen.items()},
        "best": {
            n: {k: r[k] for k in keep} | {"tokens_per_cpu_s": best_cpu[n]} for n, r in best.items()
        },
        "ratio_wall": best["variable"]["tokens_per_s"] / best["fixed"]["tokens_per_s"],
        "ratio_cpu": best_cpu["variable"] / best_cpu["fixed"],
    }


def format_varlen_bench(r: dict[str, Any]) -> str:
    """The comparison as a few lines."""
    c = r["conditions"]
    lines = [
        f"database   {r['db']}",
        f"budget     {c['tokens_per_batch']} tokens per batch; variable S in {c['sequence_lengths']} "
        f"vs fixed S={c['fixed_sequence_length']} (B={c['fixed_batch_size']}); {c['threads']} "
        f"thread(s), {c['steps']} steps after {c['warmup']} warm-up, best of {c['rounds']} "
        f"alternating rounds; load {c['load_average_before'][0]:.2f} -> "
        f"{c['load_average_after'][0]:.2f}",
        "",
        f"{'run':>9} {'Mtokens/s':>10} {'Mtokens/CPU-s':>14} {'batches/s':>10} {'fill':>6}",
    ]
    for name, b in r["best"].items():
        lines.append(
            f"{name:>9} {b['tokens_per_s'] / 1e6:>10.3f} {b['tokens_per_cpu_s'] / 1e6:>14.3f} "
            f"{b['batches_per_s']:>10.2f} {b['fill']:>6.2f}"
        )
    lines.append(
        f"variable / fixed: {r['ratio_wall']:.3f} (wall), {r['ratio_cpu']:.3f} (per CPU second)"
    )
    return "\n".join(lines)
