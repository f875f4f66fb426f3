"""Cross-rank reduction of the sampler's step telemetry (SPEC §5) with JAX.

Every rank drains its sampler once per step
(``Sampler.drain_step_metrics_packed(split)``: one ``float64`` vector in
``telemetry_keys()`` order, empty when the rank consumed no batch) and the
ranks reduce the drains into one dict that is identical on every rank:

* ``MIN`` keys: the smallest value, plus ``<key>_argmin_rank``;
* ``MAX`` keys: the largest value, plus ``<key>_argmax_rank``;
* ``SUM`` keys (counters): the cluster total ``<key>``, the worst single rank
  ``<key>_max`` and ``<key>_argmax_rank``;
* ``HISTOGRAM`` keys: bucket counts summed (``<key>/bucket_NN``), ``<key>_max``
  the largest per-rank max, and ``<key>_p50`` / ``<key>_p95`` computed from the
  *merged* buckets with the rule of ``src/telemetry/hist.rs``
  (``quantile_from_buckets``: rank ``ceil(q * total)`` clamped to >= 1, the upper
  edge of the first bucket whose cumulative count reaches it, capped by the
  merged max; the ``+inf`` bucket gives the merged max) -- never an average of
  per-rank percentiles.

The argmin/argmax rank is the lowest rank holding the reduced value. A rank
that has nothing for a key (it drained ``{}``, or its dict lacks the key)
contributes a sentinel that cannot bias the result: ``+inf`` for MIN, ``-inf``
for MAX (and histogram max), ``0`` for SUM and bucket counts. Key order comes
from the schema (snapshot metadata + config), so every rank packs identical
shapes. When no rank reported anything the result is ``{}``.

Two ways to run the collective:

* :func:`reduce` on the host: the drain is packed into one vector
  ``[mins | maxs | counters | buckets | reporting]`` and gathered from every
  JAX process with **one** collective per step (an all-gather done as one
  ``lax.all_to_all`` over one device per process: a single round, where
  gloo's ring all-gather takes ``world - 1``); MIN / MAX / SUM / argmin /
  argmax / bucket sums are then computed with numpy from the gathered
  ``[world, n]`` matrix -- identical bits on every rank. On one
  process it is the identity on the drained values (no collective; the
  ``_max`` / ``_arg*_rank`` siblings are added so the keys never depend on the
  world size).
* :func:`reduce_in_step` inside a user's jitted, ``shard_map``-ped train step:
  ``lax.pmin`` / ``lax.pmax`` / ``lax.psum`` over ``axis_name`` (plus one
  ``lax.pmin`` over rank indices for the argmin/argmax), so the metrics ride
  along with the gradient all-reduce. :meth:`Schema.pack` gives its input and
  :meth:`Schema.unpack` turns its output into the same dict as :func:`reduce`.

Exactness. Counters are rounded to multiples of ``2**-30`` right before
they are summed (a no-op for counts; sub-nanosecond rounding of
``queue/wait_seconds``), so every sum is exact whatever order a collective
adds in (as long as a fractional column stays below ``2**23`` and an integer
one below ``2**53``); ``<key>_max`` is the worst rank's value as drained. MIN
and MAX are exact anyway. Hence the host path and the in-step
path agree bit for bit, on every rank -- provided the in-step arrays are
``float64`` (``jax_enable_x64``); without x64 JAX computes in ``float32``
and the in-step values are rounded to ``float32`` (counts stay exact up to
``2**24``).

Ranks. The host path reports ``jax.process_index()``. The in-step path
reports the position along ``axis_name``; with several devices per process,
feed the drain on one device per process and :meth:`Schema.empty` on the
others, and the reported position is the device's position on that axis.

:class:`StepHook` drains, reduces and logs to sinks
(:class:`headwater.wandb.WandbSink`) once per train step; with
``buffered=True`` it logs the previous step's reduction, so that on backends
that dispatch asynchronously the train step never waits for the collective
(see the class).

``python -m headwater.telemetry --bench --processes 4`` measures the host
reduction across local CPU processes on loopback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, Self, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "QUANTILES",
    "SUM_QUANTUM",
    "Packed",
    "Reduced",
    "Schema",
    "Sink",
    "StepHook",
    "process_count",
    "process_index",
    "process_mesh",
    "reduce",
    "reduce_in_step",
    "synthetic_schema",
]

PREFIX = "sampler/"
#: The histogram percentiles the drain and the reduction report.
QUANTILES: tuple[float, float] = (0.5, 0.95)
#: Counters are rounded to multiples of this before a cross-rank sum.
SUM_QUANTUM = 2.0**-30

MIN, MAX, SUM, HISTOGRAM = "MIN", "MAX", "SUM", "HISTOGRAM"
_KINDS = (MIN, MAX, SUM, HISTOGRAM)
_INF = math.inf

F64 = npt.NDArray[np.float64]


class Packed(NamedTuple):
    """One rank's drain, one array per reduction kind (schema order).

    ``reporting`` is ``[1.0]`` when the rank reported (its drain was not
    empty), ``[0.0]`` otherwise. Arrays may carry leading axes (e.g. a
    ``[1, n]`` block inside ``shard_map``); the last axis is the key axis.
    """

    mins: Any  # MIN keys
    maxs: Any  # MAX keys, then each histogram's max
    counters: Any  # SUM keys
    buckets: Any  # every histogram's bucket counts, histograms in schema order
    reporting: Any  # [1]


class Reduced(NamedTuple):
    """The cross-rank reduction of :class:`Packed` (what :meth:`Schema.unpack` reads)."""

    mins: Any
    min_rank: Any
    maxs: Any
    max_rank: Any
    counters: Any  # cluster totals
    counter_max: Any  # worst rank
    counter_rank: Any  # lowest rank holding counter_max
    buckets: Any  # summed bucket counts
    reporting: Any  # [number of ranks that reported]


def _edge(x: Any) -> float:
    # serde_json writes the +inf edge as null; telemetry_schema() gives inf.
    return _INF if x is None else float(x)


class Schema:
    """The telemetry schema prepared for packing and reducing.

    Build it once (``Schema.of(sampler)``); it caches the drained key order,
    the index arrays per reduction kind, the reduced key order and the
    histogram bucket edges. Nothing in it grows with ranks.
    """

    def __init__(self, entries: Iterable[Mapping[str, Any]]) -> None:
        self.entries: list[dict[str, Any]] = []
        keys: list[str] = []
        kind_of: list[str] = []  # per drained key: MIN MAX SUM BUCKET HMAX Q
        hists: list[tuple[str, list[float], int]] = []  # (key, edges, first bucket pos)
        for raw in entries:
            key = str(raw["key"])
            red = str(raw["reduction"]).upper()
            if red not in _KINDS:
                raise ValueError(f"telemetry key {key!r}: unknown reduction {raw['reduction']!r}")
            edges = None if raw.get("edges") is None else [_edge(x) for x in raw["edges"]]
            if red == HISTOGRAM:
                if not edges or edges[-1] != _INF:
                    raise ValueError(f"histogram {key!r}: edges must end with +inf, got {edges}")
                hists.append((key, edges, len(keys)))
                keys += [f"{key}/bucket_{i:02}" for i in range(len(edges))]
                kind_of += ["BUCKET"] * len(edges)
                keys += [f"{key}_p50", f"{key}_p95", f"{key}_max"]
                kind_of += ["Q", "Q", "HMAX"]
            else:
                keys.append(key)
                kind_of.append(red)
            self.entries.append({"key": key, "reduction": red, "edges": edges})
        self.keys: tuple[str, ...] = tuple(keys)
        if len(set(keys)) != len(keys):
            raise ValueError("telemetry schema has duplicate keys")
        kinds = np.array(kind_of, dtype=object)
        pos = np.arange(len(keys))
        self._min_src = pos[kinds == MIN]
        self._max_src = np.concatenate([pos[kinds == MAX], pos[kinds == "HMAX"]])
        self._counter_src = pos[kinds == SUM]
        self._bucket_src = pos[kinds == "BUCKET"]
        self.n_min = len(self._min_src)
        self.n_max_keys = int((kinds == MAX).sum())
        self.n_max = len(self._max_src)
        self.n_counters = len(self._counter_src)
        self.n_buckets = len(self._bucket_src)
        self.n_hist = len(hists)
        #: Length of the host path's packed vector.
        self.size = self.n_min + self.n_max + self.n_counters + self.n_buckets + 1

        # Sentinels in drained order (what a rank without the key contributes).
        sentinel = np.zeros(len(keys))
        sentinel[kinds == MIN] = _INF
        sentinel[(kinds == MAX) | (kinds == "HMAX")] = -_INF
        sentinel[kinds == "Q"] = np.nan
        self._sentinel = sentinel
        self._sentinel_list = sentinel.tolist()

        # Histograms as a padded [n_hist, max_buckets] grid.
        nb = max((len(e) for _, e, _ in hists), default=1)
        self._edges = np.full((self.n_hist, nb), _INF)
        self._hrow = np.concatenate(
            [np.full(len(e), j) for j, (_, e, _) in enumerate(hists)] or [np.zeros(0, int)]
        ).astype(np.intp)
        self._hcol = np.concatenate(
            [np.arange(len(e)) for _, e, _ in hists] or [np.zeros(0, int)]
        ).astype(np.intp)
        for j, (_, e, _) in enumerate(hists):
            self._edges[j, : len(e)] = e
        self._nbuckets = np.array([len(e) for _, e, _ in hists], dtype=np.intp)

        # Reduced key order and where each value comes from in unpack()'s
        # flat vector [mins, min_rank, maxs, max_rank, counters, counter_max,
        # counter_rank, buckets, quantiles (n_hist x 2)].
        off = {}
        o = 0
        for name, n in (
            ("mins", self.n_min),
            ("min_rank", self.n_min),
            ("maxs", self.n_max),
            ("max_rank", self.n_max),
            ("counters", self.n_counters),
            ("counter_max", self.n_counters),
            ("counter_rank", self.n_counters),
            ("buckets", self.n_buckets),
            ("quantiles", 2 * self.n_hist),
        ):
            off[name] = o
            o += n
        out_keys: list[str] = []
        out_src: list[int] = []
        kind_out: dict[str, str] = {}
        i_min = i_max = i_cnt = i_bkt = i_h = 0
        for ent in self.entries:
            key, red = ent["key"], ent["reduction"]
            if red == MIN:
                out_keys += [key, f"{key}_argmin_rank"]
                out_src += [off["mins"] + i_min, off["min_rank"] + i_min]
                kind_out.update({key: MIN, f"{key}_argmin_rank": "RANK"})
                i_min += 1
            elif red == MAX:
                out_keys += [key, f"{key}_argmax_rank"]
                out_src += [off["maxs"] + i_max, off["max_rank"] + i_max]
                kind_out.update({key: MAX, f"{key}_argmax_rank": "RANK"})
                i_max += 1
            elif red == SUM:
                out_keys += [key, f"{key}_max", f"{key}_argmax_rank"]
                out_src += [
                    off["counters"] + i_cnt,
                    off["counter_max"] + i_cnt,
                    off["counter_rank"] + i_cnt,
                ]
                kind_out.update({key: SUM, f"{key}_max": "SUM_MAX", f"{key}_argmax_rank": "RANK"})
                i_cnt += 1
            else:
                n = len(ent["edges"])
                bk = [f"{key}/bucket_{i:02}" for i in range(n)]
                out_keys += bk
                out_src += [off["buckets"] + i_bkt + i for i in range(n)]
                kind_out.update(dict.fromkeys(bk, "BUCKET"))
                i_bkt += n
                out_keys += [f"{key}_p50", f"{key}_p95", f"{key}_max"]
                out_src += [
                    off["quantiles"] + 2 * i_h,
                    off["quantiles"] + 2 * i_h + 1,
                    off["maxs"] + self.n_max_keys + i_h,
                ]
                kind_out.update({f"{key}_p50": "QUANTILE", f"{key}_p95": "QUANTILE"})
                kind_out[f"{key}_max"] = "HIST_MAX"
                i_h += 1
        if len(set(out_keys)) != len(out_keys):
            raise ValueError("telemetry schema: a reduced key collides with another key")
        #: Keys of a reduced dict, in order.
        self.reduced_keys: tuple[str, ...] = tuple(out_keys)
        #: Reduced key -> MIN, MAX, SUM, SUM_MAX, RANK, BUCKET, QUANTILE or HIST_MAX.
        self.reduced_kinds: dict[str, str] = kind_out
        self._out_src = np.array(out_src, dtype=np.intp)
        self._drained_index = {k: i for i, k in enumerate(keys)}

    # ------------------------------------------------------------------ build

    @classmethod
    def of(cls, schema: Any) -> Schema:
        """A :class:`Schema` from a ``Schema``, a sampler (anything with
        ``telemetry_schema()``) or the list ``telemetry_schema()`` returns."""
        if isinstance(schema, Schema):
            return schema
        if hasattr(schema, "telemetry_schema"):
            out = cls(schema.telemetry_schema())
            if hasattr(schema, "telemetry_keys"):
                native = tuple(schema.telemetry_keys())
                if native != out.keys:
                    raise ValueError(
                        "telemetry_keys() does not match the keys derived from "
                        "telemetry_schema(); the Python hook and the extension disagree"
                    )
            return out
        return cls(schema)

    def __repr__(self) -> str:
        return (
            f"Schema({len(self.entries)} entries, {len(self.keys)} drained keys, "
            f"{len(self.reduced_keys)} reduced keys)"
        )

    # ---------------------------------------------------------------- packing

    def values(self, local: Mapping[str, float] | npt.ArrayLike | None) -> tuple[F64, bool]:
        """``(vector in drained-key order, reported)``; sentinels for missing keys."""
        if local is None:
            return self._sentinel.copy(), False
        if isinstance(local, Mapping):
            if not local:
                return self._sentinel.copy(), False
            get = local.get
            vec = np.fromiter(
                (get(k, d) for k, d in zip(self.keys, self._sentinel_list)),
                dtype=np.float64,
                count=len(self.keys),
            )
            return vec, True
        vec = np.asarray(local, dtype=np.float64).reshape(-1)
        if vec.size == 0:
            return self._sentinel.copy(), False
        if vec.size != len(self.keys):
            raise ValueError(
                f"packed drain has {vec.size} values, the schema {len(self.keys)} keys"
            )
        return vec, True

    def pack(self, local: Mapping[str, float] | npt.ArrayLike | None) -> Packed:
        """One rank's drain (dict, packed array, ``{}`` or ``None``) as
        :class:`Packed` ``float64`` numpy arrays, sentinels where a key is
        missing."""
        vec, reported = self.values(local)
        return Packed(
            mins=vec[self._min_src],
            maxs=vec[self._max_src],
            counters=vec[self._counter_src],
            buckets=vec[self._bucket_src],
            reporting=np.array([1.0 if reported else 0.0]),
        )

    def empty(self) -> Packed:
        """The sentinels of a rank with nothing to report."""
        return self.pack(None)

    def pack_vector(self, local: Mapping[str, float] | npt.ArrayLike | None) -> F64:
        """:meth:`pack` concatenated into one vector (the host path's payload)."""
        return np.concatenate(self.pack(local))

    def split_vector(self, vec: npt.ArrayLike) -> Packed:
        """The inverse of :meth:`pack_vector` (works on ``[..., size]`` too)."""
        v = np.asarray(vec)
        cuts = np.cumsum([self.n_min, self.n_max, self.n_counters, self.n_buckets])
        parts = np.split(v, cuts, axis=-1)
        return Packed(*parts)

    # --------------------------------------------------------------- reducing

    def reduce_matrix(self, gathered: npt.ArrayLike) -> Reduced:
        """Reduce ``[world, size]`` packed vectors (row = rank) with numpy:
        the same operations and tie rules as :func:`reduce_in_step`."""
        m = np.asarray(gathered, dtype=np.float64)
        if m.ndim != 2 or m.shape[1] != self.size:
            raise ValueError(f"expected [world, {self.size}], got {m.shape}")
        p = self.split_vector(m)
        world = m.shape[0]
        rank = np.arange(world)[:, None]
        mins = p.mins.min(axis=0)
        maxs = p.maxs.max(axis=0)
        cmax = p.counters.max(axis=0)
        return Reduced(
            mins=mins,
            min_rank=np.where(p.mins > mins, world, rank).min(axis=0),
            maxs=maxs,
            max_rank=np.where(p.maxs < maxs, world, rank).min(axis=0),
            counters=_quantise(p.counters).sum(axis=0),
            counter_max=cmax,
            counter_rank=np.where(p.counters < cmax, world, rank).min(axis=0),
            buckets=p.buckets.sum(axis=0),
            reporting=p.reporting.sum(axis=0),
        )

    def quantiles(self, buckets: npt.ArrayLike, hist_max: npt.ArrayLike) -> F64:
        """``[n_hist, 2]``: p50 and p95 of each histogram from (merged) bucket
        counts, with the rule of ``hist.rs::quantile_from_buckets``."""
        counts = np.zeros(self._edges.shape)
        counts[self._hrow, self._hcol] = np.asarray(buckets, dtype=np.float64)
        mx = np.asarray(hist_max, dtype=np.float64)
        cum = np.cumsum(counts, axis=1)
        total = cum[:, -1]
        out = np.empty((self.n_hist, len(QUANTILES)))
        rows = np.arange(self.n_hist)
        for j, q in enumerate(QUANTILES):
            rank = np.maximum(np.ceil(q * total), 1.0)
            idx = (cum < rank[:, None]).sum(axis=1)  # first bucket with cum >= rank
            past = idx >= self._nbuckets
            e = self._edges[rows, np.minimum(idx, self._nbuckets - 1)]
            # f64::min ignores a NaN operand, like np.fmin.
            v = np.where(np.isfinite(e) & ~past, np.fmin(e, mx), mx)
            out[:, j] = np.where(total == 0, np.nan, v)
        return out

    def unpack(self, reduced: Reduced | Sequence[Any]) -> dict[str, float]:
        """A :class:`Reduced` (numpy or JAX arrays -- replicated global arrays
        are read from their local shard -- possibly with leading axes) as the
        reduced dict; ``{}`` when no rank reported."""
        r = Reduced(*(_row(x) for x in reduced))
        if float(r.reporting[0]) <= 0:
            return {}
        q = self.quantiles(r.buckets, r.maxs[self.n_max_keys :])
        flat = np.concatenate(
            [
                r.mins,
                r.min_rank,
                r.maxs,
                r.max_rank,
                r.counters,
                r.counter_max,
                r.counter_rank,
                r.buckets,
                q.reshape(-1),
            ]
        )
        return dict(zip(self.reduced_keys, flat[self._out_src].tolist()))

    def identity(self, local: Mapping[str, float] | npt.ArrayLike | None) -> dict[str, float]:
        """The one-process reduction: the drained values unchanged, plus
        ``_max`` (= the value) and ``_arg*_rank`` (= 0) siblings; ``{}`` if
        nothing was drained."""
        vec, reported = self.values(local)
        if not reported:
            return {}
        mins, maxs = vec[self._min_src], vec[self._max_src]
        counters, buckets = vec[self._counter_src], vec[self._bucket_src]
        zero = np.zeros
        out = self.unpack(
            Reduced(
                mins,
                zero(self.n_min),
                maxs,
                zero(self.n_max),
                counters,
                counters,
                zero(self.n_counters),
                buckets,
                np.ones(1),
            )
        )
        # The drained values verbatim (percentiles too: the same rule, so the
        # same values, but copied rather than recomputed).
        if isinstance(local, Mapping):
            out.update((k, float(local[k])) for k in self.keys if k in local)
        else:
            out.update(zip(self.keys, vec.tolist()))
        return out


def _row(x: Any) -> F64:
    if getattr(x, "is_fully_addressable", True) is False:  # a replicated global jax.Array
        x = x.addressable_data(0)
    a = np.asarray(x)
    return a.reshape(-1, a.shape[-1])[0] if a.ndim > 1 else a.reshape(-1)


def _quantise(x: Any) -> Any:
    """``x`` rounded to a multiple of :data:`SUM_QUANTUM` (half to even), so
    that sums of such values are exact in any order. Works on numpy and JAX
    arrays alike (the same float operations, the same bits)."""
    return (x * (1.0 / SUM_QUANTUM)).round() * SUM_QUANTUM


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


def _shard_map(f: Any, mesh: Any, in_specs: Any, out_specs: Any) -> Any:
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


class _Gather:
    """Gather a ``float64`` vector from every process (one device each) with
    one collective, sent as its ``uint32`` bit pattern (exact without
    ``jax_enable_x64``)."""

    _instance: _Gather | None = None

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

        self._fn = jax.jit(_shard_map(gather, self.mesh, in_specs=P("processes"), out_specs=P()))

    @classmethod
    def get(cls) -> _Gather:
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
            self._result = self.schema.unpack(self.schema.reduce_matrix(_Gather.finish(self._out)))
            self._out = None
        return self._result


def _start(local: Mapping[str, float] | npt.ArrayLike | None, schema: Schema) -> _Pending:
    if process_count() == 1:
        return _Pending(schema, schema.identity(local), None)
    return _Pending(schema, None, _Gather.get().start(schema.pack_vector(local)))


def reduce(local: Mapping[str, float] | npt.ArrayLike | None, schema: Any) -> dict[str, float]:
    """Reduce this rank's drain across all JAX processes (host path).

    ``local``: ``drain_step_metrics()`` (dict) or ``drain_step_metrics_packed()``
    (array); ``{}`` / empty when the rank consumed no batch. ``schema``: a
    :class:`Schema` (build it once), a sampler or ``telemetry_schema()``.
    Every process must call it at the same point (it is a collective); all get
    the same dict. On one process: the identity plus siblings, no collective.
    """
    return _start(local, Schema.of(schema)).result()


# ---------------------------------------------------------------------------
# Hook
# ---------------------------------------------------------------------------


@runtime_checkable
class Sink(Protocol):
    """Where a :class:`StepHook` sends reduced dicts (e.g.
    :class:`headwater.wandb.WandbSink`). Optional methods: ``bind(schema)``
    (called once with the :class:`Schema`) and ``close()``."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...


class StepHook:
    """Drain, reduce and log the sampler's step telemetry once per train step.

    ``hook.step(step)`` drains ``split`` (packed), reduces it across processes
    (:func:`reduce`; a collective, so call it on every process, every step),
    logs the reduced dict to every sink against ``step`` (skipped when no rank
    reported) and returns it.

    ``buffered=True``: ``step(t)`` dispatches step ``t``'s collective without
    waiting for it (JAX dispatches asynchronously), then finishes step
    ``t - 1``'s -- which has had a whole train step to complete -- logs it
    against ``t - 1`` and returns it (``{}`` on the first call). On backends
    that dispatch asynchronously (GPU, TPU) the train step therefore never
    waits on the telemetry collective, and the reduction and the sinks work on
    a step that is already complete; the cost is one step of latency in the
    dashboards. (XLA:CPU runs a program this small inline at dispatch, so on
    CPU the collective is still paid inside ``step``.) Call :meth:`flush` (or
    :meth:`close`) after the last step to log the final one.
    """

    def __init__(
        self,
        sampler: Any,
        sinks: Iterable[Sink] = (),
        split: str = "train",
        buffered: bool = False,
        schema: Any = None,
    ) -> None:
        self.sampler = sampler
        self.split = split
        self.buffered = buffered
        self.schema = Schema.of(sampler if schema is None else schema)
        self.sinks = list(sinks)
        for s in self.sinks:
            bind = getattr(s, "bind", None)
            if callable(bind):
                bind(self.schema)
        self._pending: tuple[int, _Pending] | None = None

    def step(self, step: int) -> dict[str, float]:
        local = self.sampler.drain_step_metrics_packed(self.split)
        pending = _start(local, self.schema)
        if not self.buffered:
            return self._emit(step, pending)
        prev, self._pending = self._pending, (step, pending)
        return self._emit(*prev) if prev is not None else {}

    def flush(self) -> dict[str, float]:
        """Finish and log the reduction still in flight (buffered mode)."""
        prev, self._pending = self._pending, None
        return self._emit(*prev) if prev is not None else {}

    def close(self) -> None:
        self.flush()
        for s in self.sinks:
            close = getattr(s, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, step: int, pending: _Pending) -> dict[str, float]:
        reduced = pending.result()
        if reduced:
            for s in self.sinks:
                s.log(reduced, step)
        return reduced


# ---------------------------------------------------------------------------
# Synthetic schema and the benchmark
# ---------------------------------------------------------------------------


def synthetic_schema(
    task_names: Sequence[str] = ("task_a", "task_b", "task_c", "task_d", "task_e", "task_f"),
    max_hops: int = 3,
    seq_len: int = 1024,
) -> list[dict[str, Any]]:
    """The list ``telemetry_schema()`` returns for a database with these
    tasks (mirrors ``src/telemetry/schema.rs``; for benchmarks and tests
    that run without a database)."""

    def pow2(upto: int) -> list[float]:
        e, x = [], 1
        while x < upto:
            e.append(float(x))
            x *= 2
        return [*e, float(upto), _INF]

    seconds = [1e-6 * (1 << k) for k in range(25)] + [_INF]
    padding = [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, _INF]
    rows: list[tuple[str, str, list[float] | None]] = [
        ("pool/remaining_min", MIN, None),
        ("pool/remaining_max", MAX, None),
        ("pool/remaining_fraction_min", MIN, None),
        ("pool/remaining_fraction_max", MAX, None),
        ("pool/steps_since_pick_max", MAX, None),
        ("pool/steps_to_exhaust_min", MIN, None),
        ("pool/exhaust_events", SUM, None),
        ("mix/tv_distance", MAX, None),
        *((f"tasks/{t}", SUM, None) for t in task_names),
        ("bfs/depth", HISTOGRAM, [float(h) for h in range(max_hops + 1)] + [_INF]),
        ("bfs/rows", HISTOGRAM, pow2(seq_len)),
        ("padding/fraction", HISTOGRAM, padding),
        ("truncation/cells_dropped", SUM, None),
        ("bfs/children_capped", SUM, None),
        ("bfs/temporal_filtered", SUM, None),
        ("queue/depth_min", MIN, None),
        ("queue/wait_seconds", SUM, None),
        ("stage/bfs_seconds", HISTOGRAM, seconds),
        ("stage/assemble_seconds", HISTOGRAM, seconds),
        ("stage/collate_seconds", HISTOGRAM, seconds),
        ("stage/total_seconds", HISTOGRAM, seconds),
        ("invariants/duplicate_seeds", SUM, None),
        ("invariants/temporal_leaks", SUM, None),
        ("batches", SUM, None),
    ]
    return [{"key": PREFIX + k, "reduction": r, "edges": e, "help": ""} for k, r, e in rows]


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def initialize_loopback(rank: int, world: int, port: int, timeout_s: int = 120) -> None:
    """Join a ``jax.distributed`` job of ``world`` CPU processes on this
    machine: coordinator on 127.0.0.1:``port`` (bound to loopback only), gloo
    collectives. How tests, benchmarks and the local launcher start ranks."""
    import jax

    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        coordinator_bind_address=f"127.0.0.1:{port}",
        num_processes=world,
        process_id=rank,
        initialization_timeout=timeout_s,
    )


def _bench_worker(rank: int, world: int, port: int, steps: int, warmup: int) -> None:
    import jax

    initialize_loopback(rank, world, port)
    try:
        schema = Schema(synthetic_schema())
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
        gather, vec = _Gather.get(), schema.pack_vector(packed[0])
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
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headwater.telemetry",
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
        prog="python -m headwater.telemetry",
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
