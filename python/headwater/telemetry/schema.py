"""The telemetry schema prepared for packing and reducing (host side).

:class:`Schema` turns ``telemetry_schema()`` (the native metric table
expanded for one database and config) into index arrays per reduction kind,
packs one rank's drain into :class:`Packed`, reduces gathered drains with
numpy and unpacks a :class:`Reduced` into the reduced dict. Quantiles follow
the rule of ``crates/telemetry/src/hist.rs`` (read from the schema's ``quantile``
field per histogram). Pure numpy; no JAX here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from headwater._native import TELEMETRY_PREFIX

__all__ = [
    "HISTOGRAM",
    "MAX",
    "MIN",
    "PREFIX",
    "QUANTILES",
    "SUM",
    "SUM_QUANTUM",
    "Packed",
    "Reduced",
    "Schema",
]

#: Every drained key starts with this (the native constant).
PREFIX: str = TELEMETRY_PREFIX
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


def _parse_entry(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """One ``telemetry_schema()`` entry checked: (entry, its drained keys,
    their kinds: MIN MAX SUM, or BUCKET … Q Q HMAX for a histogram)."""
    key = str(raw["key"])
    red = str(raw["reduction"]).upper()
    if red not in _KINDS:
        raise ValueError(f"telemetry key {key!r}: unknown reduction {raw['reduction']!r}")
    edges = None if raw.get("edges") is None else [_edge(x) for x in raw["edges"]]
    ent = {"key": key, "reduction": red, "edges": edges, "quantile": raw.get("quantile")}
    if red != HISTOGRAM:
        return ent, [key], [red]
    if not edges or edges[-1] != _INF:
        raise ValueError(f"histogram {key!r}: edges must end with +inf, got {edges}")
    rule = raw.get("quantile") or "upper_edge"
    if rule not in ("upper_edge", "midpoint"):
        raise ValueError(f"histogram {key!r}: unknown quantile rule {rule!r}")
    ent["quantile"] = rule
    drained = [f"{key}/bucket_{i:02}" for i in range(len(edges))]
    drained += [f"{key}_p50", f"{key}_p95", f"{key}_max"]
    return ent, drained, ["BUCKET"] * len(edges) + ["Q", "Q", "HMAX"]


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
        midpoint: list[bool] = []  # per histogram: quantile rule "midpoint"
        for raw in entries:
            ent, drained, kinds_of_drained = _parse_entry(raw)
            if ent["reduction"] == HISTOGRAM:
                hists.append((ent["key"], ent["edges"], len(keys)))
                midpoint.append(ent["quantile"] == "midpoint")
            keys += drained
            kind_of += kinds_of_drained
            self.entries.append(ent)
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

        self._histogram_grid(hists, midpoint)

        # Reduced key order and where each value comes from in unpack()'s flat vector.
        off = self._unpack_offsets()
        out_keys, out_src, kind_out = self._reduced_layout(off)
        if len(set(out_keys)) != len(out_keys):
            raise ValueError("telemetry schema: a reduced key collides with another key")
        #: Keys of a reduced dict, in order.
        self.reduced_keys: tuple[str, ...] = tuple(out_keys)
        #: Reduced key -> MIN, MAX, SUM, SUM_MAX, RANK, BUCKET, QUANTILE or HIST_MAX.
        self.reduced_kinds: dict[str, str] = kind_out
        self._out_src = np.array(out_src, dtype=np.intp)
        self._drained_index = {k: i for i, k in enumerate(keys)}

    def _histogram_grid(
        self, hists: list[tuple[str, list[float], int]], midpoint: list[bool]
    ) -> None:
        """The histograms ``(key, edges, first bucket position)`` as a padded
        ``[n_hist, max_buckets]`` grid of edges, the (row, column) of each
        drained bucket in it, and each histogram's quantile rule."""
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
        # Lower edge of each bucket (0 for the first), for the midpoint rule.
        self._lower = np.zeros_like(self._edges)
        self._lower[:, 1:] = self._edges[:, :-1]
        self._midpoint = np.array(midpoint, dtype=bool)
        self._nbuckets = np.array([len(e) for _, e, _ in hists], dtype=np.intp)

    def _unpack_offsets(self) -> dict[str, int]:
        """Where each part starts in :meth:`unpack`'s flat vector [mins,
        min_rank, maxs, max_rank, counters, counter_max, counter_rank,
        buckets, quantiles (n_hist x 2)]."""
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
        return off

    def _reduced_layout(self, off: dict[str, int]) -> tuple[list[str], list[int], dict[str, str]]:
        """Reduced key order, where each value sits in :meth:`unpack`'s flat
        vector (offsets ``off``), and each reduced key's kind."""
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
        return out_keys, out_src, kind_out

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
                (get(k, d) for k, d in zip(self.keys, self._sentinel_list, strict=True)),
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
        counts, with the rule of ``hist.rs::quantile_from_buckets``: the
        bucket's upper edge, or (schema ``"quantile": "midpoint"``, the
        latency histograms) the midpoint of its lower and upper edges; capped
        by the max."""
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
            col = np.minimum(idx, self._nbuckets - 1)
            e = self._edges[rows, col]
            e = np.where(self._midpoint, (self._lower[rows, col] + e) / 2.0, e)
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
        return dict(zip(self.reduced_keys, flat[self._out_src].tolist(), strict=True))

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
            out.update(zip(self.keys, vec.tolist(), strict=True))
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
