"""The categorical head's memory and time, all windows at once against chunks.

Samples one training batch with masked cells (``mask_prob_max``, mixed
tasks) from a database, then for each head configuration compiles (a) the
head alone, forward + backward of its logits with respect to the query and
the table, and (b) the model's full train step (forward, backward, Muon
update), and reports each one's temporary memory from XLA's
``memory_analysis()``; then times the train steps, interleaved, and prints
the median of ``--rounds`` and the load average. Configurations: ``before``
(``cat_chunk_mib = 0, cat_head_impl = "gather"``: every ``[N, C, d]`` window
at once, the head as it was), ``gather`` (64 MiB chunks), ``auto`` (the
default). Usage, from the repository root::

    PYTHONPATH=python python scripts/cat_head_memory.py [--db DB] [--preset rt]
        [--layers 2] [--remat none] [-B 8] [-S 512] [--rounds 3]

The default database is the embedded TPC-H SF 0.01 (``C = 152``, ``V =
279``). Figures in ``docs/training.md`` ("Categorical head memory").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import headwater
from headwater import _native
from headwater.model import cat_head as CH
from headwater.model import device as DV
from headwater.model import scale
from headwater.model import transformer as M
from headwater.model.optim import OptConfig

CONFIGS: dict[str, dict[str, Any]] = {
    "before": {"cat_chunk_mib": 0, "cat_head_impl": "gather"},
    "gather": {"cat_chunk_mib": CH.CAT_CHUNK_MIB, "cat_head_impl": "gather"},
    "auto": {},
}
MIB = 1 << 20


def _head_temp(cfg: M.ModelConfig, batch: dict[str, Any], table: jax.Array) -> int:
    """Temporary bytes of the head's forward + backward alone."""
    start = M.per_target(batch, "cat_emb_start")
    count = M.per_target(batch, "cat_emb_count")
    n, c, d = int(start.shape[0]), cfg.max_categories, cfg.d_model
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((n, c)), jnp.float32)

    def loss(q: jax.Array, t: jax.Array) -> jax.Array:
        out = CH.categorical_logits(q, t, start, count, c, cfg.cat_chunk_mib, cfg.cat_head_impl)
        return jnp.sum(jnp.where(out > -1e8, out, 0.0) * g)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(q, table).compile()
    return _temp(compiled)


def _temp(compiled: Any) -> int:
    """Temporary bytes of a compiled program (XLA's buffer assignment)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise SystemExit("this backend reports no memory analysis")
    return int(analysis.temp_size_in_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=None, help="a preprocessed database (default: TPC-H SF 0.01)")
    ap.add_argument("--preset", default="rt")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--remat", default="none")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-S", type=int, default=512)
    ap.add_argument("--mask-prob-max", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3, help="timed steps (0: compile only)")
    a = ap.parse_args()
    db = a.db or headwater.default_database()
    s = _native.Sampler(
        db,
        default_batch_size=a.B,
        default_sequence_length=a.S,
        mask_prob_max=a.mask_prob_max,
        task_mixing="sequence",
        num_threads=1,
        telemetry=False,
    )
    try:
        batch = DV.batch_to_device(s.next_train_batch())
        col, cat = DV.tables_to_device(s.column_embeddings(), s.categorical_embeddings())
        meta = s.database_metadata()
    finally:
        s.shutdown()
    base = M.ModelConfig(
        **{
            **scale.preset(a.preset),
            "num_layers": a.layers,
            "remat": a.remat,
            "max_categories": M.max_categories(meta),
        }
    )
    n = int(M.target_weights(batch).shape[0])
    c, d, v = base.max_categories, base.d_model, int(cat.shape[0])
    print(
        f"{a.preset} d {d} layers {a.layers} remat {a.remat}; B {a.B} S {a.S} N {n} C {c} V {v}; "
        f"[N, C, d] float32 = {n * c * d * 4 / MIB:.1f} MiB"
    )
    opt = OptConfig(warmup_steps=0, total_steps=10)
    params = M.init_params(0, base, int(col.shape[1]))
    state = M.init_opt_state(params, opt)
    table = M._project_table(cat, params["enc"]["emb_proj"][1], base.dtype)
    steps = {}
    for name, fields in CONFIGS.items():
        cfg = dataclasses.replace(base, **fields)
        impl = CH.pick_impl(cfg.cat_head_impl, v, c, d)
        step: Any = M.make_train_step(cfg, opt)
        compiled = step.lower(params, state, batch, col, cat).compile()
        temp = _temp(compiled)
        head = _head_temp(cfg, batch, table)
        steps[name] = compiled
        line = f"{name:7s} ({impl}, {cfg.cat_chunk_mib} MiB): head fwd+bwd temp {head / MIB:8.1f} MiB, "
        line += f"train step temp {temp / MIB:8.1f} MiB"
        if a.rounds:
            out = jax.block_until_ready(compiled(params, state, batch, col, cat))
            line += f", loss {float(out[2]['loss']):.6f}"
        print(line)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(a.rounds):
        for name, compiled in steps.items():
            t0 = time.perf_counter()
            jax.block_until_ready(compiled(params, state, batch, col, cat))
            times[name].append(time.perf_counter() - t0)
    for name, ts in times.items() if a.rounds else ():
        runs = ", ".join(f"{t * 1e3:.0f}" for t in ts)
        print(f"{name:7s} step median {statistics.median(ts) * 1e3:.0f} ms ({runs})")
    print("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
