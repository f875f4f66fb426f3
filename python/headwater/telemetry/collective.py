"""The cross-rank collectives: :func:`reduce_in_step` inside a jitted /
``shard_map``-ped step, and :func:`reduce` on the host (one gather per step
over a one-device-per-process mesh), plus the process helpers they use."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from headwater.telemetry.schema import F64, Packed, Reduced, Schema, _quantise

__all__ = [
    "Gather",
    "process_count",
    "process_index",
    "process_mesh",
    "reduce",
    "reduce_in_step",
    "shard_map",
]

# ---------------------------------------------------------------------------
# In-step (inside a jitted / shard_mapped train step)
# ---------------------------------------------------------------------------


def reduce_in_step(packed: Packed | Sequence[Any], axis_name: Any) -> Reduced:
    """Reduce :meth:`Schema.pack` arrays across ``axis_name`` inside
    ``shard_map`` (or any context where ``axis_name`` is bound).

    Collectives: ``lax.pmin`` (MIN keys), ``lax.pmax`` (MAX keys, histogram
    maxima and the counters' worst rank), ``lax.psum`` (counters, buckets,
    reporting ranks) -- independent, so XLA may fuse them with the gradient
    all-reduce -- then one ``lax.pmin`` over rank indices for the argmin /
    argmax ranks. Every output is replicated over ``axis_name``; feed it to
    :meth:`Schema.unpack` on the host. Same results as :func:`reduce`
    (bit for bit with ``float64`` arrays, see the module docstring).
    """
    import jax.numpy as jnp
    from jax import lax

    p = Packed(*packed)
    rank = lax.axis_index(axis_name)
    world = lax.psum(1, axis_name)
    n_max, n_cnt, n_bkt = p.maxs.shape[-1], p.counters.shape[-1], p.buckets.shape[-1]

    mins = lax.pmin(p.mins, axis_name)
    both = lax.pmax(jnp.concatenate([p.maxs, p.counters], axis=-1), axis_name)
    maxs, cmax = both[..., :n_max], both[..., n_max:]
    sums = lax.psum(
        jnp.concatenate([_quantise(p.counters), p.buckets, p.reporting], axis=-1), axis_name
    )

    def first(holds: Any) -> Any:  # lowest rank holding the reduced value
        return jnp.where(holds, rank, world)

    ranks = lax.pmin(
        jnp.concatenate(
            [first(~(p.mins > mins)), first(~(p.maxs < maxs)), first(~(p.counters < cmax))],
            axis=-1,
        ),
        axis_name,
    )
    n_min = p.mins.shape[-1]
    return Reduced(
        mins=mins,
        min_rank=ranks[..., :n_min],
        maxs=maxs,
        max_rank=ranks[..., n_min : n_min + n_max],
        counters=sums[..., :n_cnt],
        counter_max=cmax,
        counter_rank=ranks[..., n_min + n_max :],
        buckets=sums[..., n_cnt : n_cnt + n_bkt],
        reporting=sums[..., n_cnt + n_bkt :],
    )


# ---------------------------------------------------------------------------
# Host path
# ---------------------------------------------------------------------------


def _jax() -> Any:
    """JAX if this process uses it (imported), else None: a process that never
    imported JAX is one process, and importing it here would start a backend."""
    return sys.modules.get("jax")


def process_count() -> int:
    """``jax.process_count()``, or 1 in a process that never imported JAX."""
    jax = _jax()
    return 1 if jax is None else int(jax.process_count())


def process_index() -> int:
    """``jax.process_index()``, or 0 in a process that never imported JAX."""
    jax = _jax()
    return 0 if jax is None else int(jax.process_index())


def shard_map(f: Any, mesh: Any, in_specs: Any, out_specs: Any) -> Any:
    import jax

    if hasattr(jax, "shard_map"):
        try:
            return jax.shard_map(
                f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
            )
        except TypeError:  # pragma: no cover - older signature
            return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map  # pragma: no cover - jax < 0.7

    return shard_map(f, mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def process_mesh(axis_name: str = "processes") -> Any:
    """A 1-D mesh of the first device of every JAX process, in process order
    (built identically on every process)."""
    import jax
    from jax.sharding import Mesh

    first: dict[int, Any] = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        first.setdefault(d.process_index, d)
    return Mesh(np.array([first[i] for i in sorted(first)]), (axis_name,))


class Gather:
    """Gather a ``float64`` vector from every process (one device each) with
    one collective, sent as its ``uint32`` bit pattern (exact without
    ``jax_enable_x64``)."""

    _instance: Gather | None = None

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp
        from jax import lax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.mesh = process_mesh("processes")
        self.world = self.mesh.devices.size
        me = jax.process_index()
        self.device = next(d for d in self.mesh.devices.flat if d.process_index == me)
        self.sharding = NamedSharding(self.mesh, P("processes"))
        world = self.world

        def gather(x: Any) -> Any:
            # An all-gather as one all-to-all: every process sends its row to
            # every other at once (one round; gloo's ring all-gather needs
            # world - 1 rounds and takes about twice as long on loopback).
            rows = jnp.broadcast_to(x, (world, x.shape[1]))
            return lax.all_to_all(rows, "processes", 0, 0, tiled=True)

        self._fn = jax.jit(shard_map(gather, self.mesh, in_specs=P("processes"), out_specs=P()))

    @classmethod
    def get(cls) -> Gather:
        import jax

        if cls._instance is None or cls._instance.world != jax.process_count():
            cls._instance = cls()
        return cls._instance

    def start(self, vec: F64) -> Any:
        """Dispatch the collective (asynchronous under JAX's async dispatch)."""
        import jax

        bits = np.ascontiguousarray(vec, dtype=np.float64).view(np.uint32)[None]
        local = jax.device_put(bits, self.device)
        arr = jax.make_array_from_single_device_arrays(
            (self.world, bits.shape[1]), self.sharding, [local]
        )
        return self._fn(arr)

    @staticmethod
    def finish(out: Any) -> F64:
        bits = np.asarray(out.addressable_data(0))
        return np.ascontiguousarray(bits).view(np.float64)


class _Pending:
    """A host reduction in flight (see :meth:`StepHook.step` with ``buffered``)."""

    def __init__(self, schema: Schema, result: dict[str, float] | None, out: Any) -> None:
        self.schema, self._result, self._out = schema, result, out

    def result(self) -> dict[str, float]:
        if self._result is None:
            self._result = self.schema.unpack(self.schema.reduce_matrix(Gather.finish(self._out)))
            self._out = None
        return self._result


def _start(local: Mapping[str, float] | npt.ArrayLike | None, schema: Schema) -> _Pending:
    if process_count() == 1:
        return _Pending(schema, schema.identity(local), None)
    return _Pending(schema, None, Gather.get().start(schema.pack_vector(local)))


def reduce(local: Mapping[str, float] | npt.ArrayLike | None, schema: Any) -> dict[str, float]:
    """Reduce this rank's drain across all JAX processes (host path).

    ``local``: ``drain_step_metrics()`` (dict) or ``drain_step_metrics_packed()``
    (array); ``{}`` / empty when the rank consumed no batch. ``schema``: a
    :class:`Schema` (build it once), a sampler or ``telemetry_schema()``.
    Every process must call it at the same point (it is a collective); all get
    the same dict. On one process: the identity plus siblings, no collective.
    """
    return _start(local, Schema.of(schema)).result()
