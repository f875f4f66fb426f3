"""``headwater bench --embedder minilm``: strings/s of MiniLM's JAX forward
pass beside the numpy one, on the same strings, in one process.

This module owns the embedding benchmark: its string set (distinct values of
the comment columns of a TPC-H database that DuckDB's ``dbgen`` builds in
memory at a small scale factor, sampled with a fixed seed; nothing is
downloaded) and its timing. One untimed call per path first loads the model
and, for JAX, compiles every shape the strings need (reported as
``warmup_s``); then ``rounds`` rounds each time the numpy path and the JAX
path on all strings, alternating so load drift hits both alike. Both paths
bypass the disk cache. Reported: strings/s of each path (best round), the
ratio of the best rounds, every round, the JAX device, the token counts and
the load average before and after (docs/preprocessing.md, "Embedding speed").
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

__all__ = ["EMBED_BENCH_NAMES", "format_embed_bench", "run_embed_bench", "tpch_comment_strings"]

#: Embedders ``bench --embedder`` knows.
EMBED_BENCH_NAMES: tuple[str, ...] = ("minilm",)

_COMMENT_COLUMNS = (
    ("region", "r_comment"),
    ("nation", "n_comment"),
    ("supplier", "s_comment"),
    ("customer", "c_comment"),
    ("part", "p_comment"),
    ("partsupp", "ps_comment"),
    ("orders", "o_comment"),
    ("lineitem", "l_comment"),
)


def tpch_comment_strings(count: int, scale_factor: float = 0.01, seed: int = 0) -> list[str]:
    """``count`` distinct TPC-H comment values (all tables), sampled with ``seed``."""
    import duckdb

    from headwater.data.tpch import _populate, tpch_extension_path

    with duckdb.connect(":memory:") as con:
        _populate(con, tpch_extension_path(), scale_factor)
        union = " UNION ".join(f"SELECT {col} AS t FROM {table}" for table, col in _COMMENT_COLUMNS)
        values = sorted(
            str(row[0]) for row in con.execute(f"SELECT DISTINCT t FROM ({union})").fetchall()
        )
    if count > len(values):
        raise ValueError(
            f"asked for {count} strings; TPC-H at sf {scale_factor} has {len(values)} distinct comments"
        )
    return random.Random(seed).sample(values, count)


def _time_embed(emb: Any, texts: list[str]) -> float:
    start = time.perf_counter()
    emb.embed(texts)
    return time.perf_counter() - start


def run_embed_bench(embedder: str, strings: int = 1000, rounds: int = 3) -> dict[str, Any]:
    """Time the JAX and numpy forward passes of ``embedder`` on the same strings."""
    if embedder not in EMBED_BENCH_NAMES:
        raise ValueError(
            f"bench --embedder: unknown {embedder!r}; expected one of {list(EMBED_BENCH_NAMES)}"
        )
    if strings < 1 or rounds < 1:
        raise ValueError(
            f"bench --embedder needs --strings >= 1 and --rounds >= 1, got {strings}, {rounds}"
        )
    try:
        from headwater.embedders.minilm_jax import MiniLMJaxEmbedder, device_description
    except ImportError as exc:
        raise RuntimeError(
            f"bench --embedder {embedder} compares against JAX, which is not importable: {exc}"
        ) from exc
    from headwater.embedders.minilm import MiniLMEmbedder

    texts = tpch_comment_strings(strings)
    jax_path = MiniLMJaxEmbedder(min_texts=0, warm_after=0)  # JAX at any size
    paths: dict[str, Any] = {"numpy": MiniLMEmbedder(), "jax": jax_path}
    load_before = os.getloadavg()
    warmup = {name: _time_embed(emb, texts) for name, emb in paths.items()}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, emb in paths.items():
            times[name].append(_time_embed(emb, texts))
    _, lengths = paths["numpy"]._tokenize(texts)
    best = {name: min(ts) for name, ts in times.items()}
    return {
        "embedder": embedder,
        "strings": len(texts),
        "string_source": "distinct TPC-H comments, sf 0.01",
        "tokens_mean": float(lengths.mean()),
        "tokens_max": int(lengths.max()),
        "rounds": rounds,
        "device": device_description(),
        "cpus": os.cpu_count(),
        "warmup_s": warmup,
        "round_s": times,
        "jax_strings_per_s": len(texts) / best["jax"],
        "numpy_strings_per_s": len(texts) / best["numpy"],
        "ratio": best["numpy"] / best["jax"],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def format_embed_bench(r: dict[str, Any]) -> str:
    """The benchmark's result as a few human-readable lines."""
    rounds = ", ".join(
        f"{name} " + " ".join(f"{t:.2f}" for t in ts) for name, ts in r["round_s"].items()
    )
    load = "/".join(f"{x:.2f}" for x in r["load_average_before"])
    load_after = "/".join(f"{x:.2f}" for x in r["load_average_after"])
    return "\n".join(
        [
            f"embedder {r['embedder']}: {r['strings']} {r['string_source']} "
            f"(tokens mean {r['tokens_mean']:.1f}, max {r['tokens_max']})",
            f"jax ({r['device']}): {r['jax_strings_per_s']:.1f} strings/s",
            f"numpy: {r['numpy_strings_per_s']:.1f} strings/s",
            f"ratio jax/numpy: {r['ratio']:.2f}x (best of {r['rounds']} interleaved rounds)",
            f"rounds (s): {rounds}; warm-up (s, model load + JAX compiles): "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["warmup_s"].items()),
            f"load average before {load}, after {load_after}; {r['cpus']} CPUs",
        ]
    )
