"""One rank of the multi-process telemetry tests (``test_hook.py``).

Run as ``python hook_worker.py CONFIG_JSON``; the test starts one such process
per rank, each with ``JAX_PLATFORMS=cpu``, and they meet on a loopback
coordinator (``jax.distributed.initialize``). Each rank samples its own shard
of the database (``rank`` of ``world``), consumes the number of batches the
plan gives it per step (0 = it drains ``{}``), and per step records:

* ``drained``: its drained dict (from the packed drain the hook read);
* ``returned``: what ``StepHook.step`` returned (buffered: the previous step);
* ``logged``: what the hook sent to its sinks, with the step;
* ``in_step``: the same drain reduced with ``reduce_in_step`` inside a jitted
  ``shard_map`` over one device per process (x64 on), next to a dummy
  gradient ``psum`` as in a train step, unpacked on the host.

Rank 0 logs to an offline W&B run; the other ranks hand the sink a run that
records any call (there must be none). Everything is written to
``CONFIG["out"]`` as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


class RecordingRun:
    """Stands in for a W&B run on ranks > 0: counts every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append(name)

        return call


class RecordingSampler:
    """Forwards to the sampler and keeps every packed drain."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.drains: list[Any] = []

    def drain_step_metrics_packed(self, split: str = "train") -> Any:
        v = self.sampler.drain_step_metrics_packed(split)
        self.drains.append(v)
        return v

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


class ListSink:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: Any, step: int) -> None:
        self.rows.append((step, dict(metrics)))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rank, world = cfg["rank"], cfg["world"]

    import jax

    jax.config.update("jax_enable_x64", True)  # the in-step path in float64
    from headwater.telemetry import initialize_loopback

    initialize_loopback(rank, world, cfg["port"], timeout_s=60)
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from headwater import _native
    from headwater import telemetry as T
    from headwater.telemetry import WandbSink

    assert jax.process_count() == world and jax.process_index() == rank

    kw = dict(cfg["sampler"])
    kw["split_ratios"] = tuple(kw["split_ratios"])  # JSON made it a list
    sampler = _native.Sampler(cfg["db"], rank=rank, world_size=world, **kw)
    rec = RecordingSampler(sampler)
    run: Any
    if rank == 0:
        import wandb

        run = wandb.init(
            mode="offline", dir=cfg["wandb_dir"], project="headwater-test", name="hook"
        )
    else:
        run = RecordingRun()
    listed = ListSink()
    hook = T.StepHook(rec, sinks=[WandbSink(run), listed], buffered=cfg["buffered"])
    schema = hook.schema

    # The in-step path: a jitted shard_map over one device per process.
    mesh = T.process_mesh("ranks")
    me = next(d for d in mesh.devices.flat if d.process_index == rank)
    sharding = NamedSharding(mesh, P("ranks"))

    def train_step(grads: Any, packed: Any) -> Any:
        return lax.psum(grads, "ranks"), T.reduce_in_step(packed, "ranks")

    step_fn = jax.jit(
        jax.shard_map(
            train_step,
            mesh=mesh,
            in_specs=(P("ranks"), P("ranks")),
            out_specs=(P(), P()),
            check_vma=False,
        )
    )

    def global_array(a: Any) -> Any:
        a = np.asarray(a)[None]
        return jax.make_array_from_single_device_arrays(
            (world, *a.shape[1:]), sharding, [jax.device_put(a, me)]
        )

    keys = sampler.telemetry_keys()
    out: dict[str, Any] = {"drained": [], "returned": [], "in_step": [], "logged": []}
    for step, counts in enumerate(cfg["plan"]):
        for _ in range(counts[rank]):
            sampler.next_train_batch()
        out["returned"].append(hook.step(step))
        packed_drain = rec.drains[-1]
        out["drained"].append(dict(zip(keys, packed_drain.tolist(), strict=False)))  # {} when empty
        packed = schema.pack(packed_drain)
        grads = global_array(np.full(3, float(rank)))
        g, red = step_fn(grads, T.Packed(*map(global_array, packed)))
        assert (
            np.asarray(g.addressable_data(0)).reshape(-1).tolist() == [world * (world - 1) / 2] * 3
        )
        out["in_step"].append(schema.unpack(red))  # replicated global arrays
    out["returned_at_close"] = hook.flush()
    hook.close()
    out["logged"] = [[s, m] for s, m in listed.rows]
    out["keys"] = keys
    out["schema"] = sampler.telemetry_schema()
    out["reduced_keys"] = list(schema.reduced_keys)
    if rank == 0:
        out["wandb_run_dir"] = run.dir
        run.finish()
    else:
        out["fake_run_calls"] = run.calls
    sampler.shutdown()
    tmp = Path(cfg["out"] + ".tmp")
    tmp.write_text(json.dumps(out), encoding="utf-8")
    os.replace(tmp, cfg["out"])
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
