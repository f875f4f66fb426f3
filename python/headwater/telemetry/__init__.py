"""Cross-rank reduction of the sampler's step telemetry (docs/telemetry.md) with JAX.

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
  *merged* buckets with the rule of ``crates/telemetry/src/hist.rs``
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
(:class:`headwater.telemetry.WandbSink`) once per train step; with
``buffered=True`` it logs the previous step's reduction, so that on backends
that dispatch asynchronously the train step never waits for the collective
(see the class).

``python -m headwater.telemetry --bench --processes 4`` measures the host
reduction across local CPU processes on loopback.

Modules: ``schema`` (packing, numpy reduction, quantile rule), ``collective``
(the JAX collectives), ``hook`` (:class:`StepHook`), ``sinks``
(:class:`WandbSink`), ``loopback`` (local ``jax.distributed``), ``bench``.
"""

from __future__ import annotations

from headwater.telemetry.collective import (
    Gather,
    process_count,
    process_index,
    process_mesh,
    reduce,
    reduce_in_step,
    shard_map,
)
from headwater.telemetry.hook import Sink, StepHook
from headwater.telemetry.loopback import free_port, initialize_loopback
from headwater.telemetry.schema import (
    HISTOGRAM,
    MAX,
    MIN,
    PREFIX,
    QUANTILES,
    SUM,
    SUM_QUANTUM,
    Packed,
    Reduced,
    Schema,
)
from headwater.telemetry.sinks import STEP_METRIC, WandbSink, summary_for

__all__ = [
    "HISTOGRAM",
    "MAX",
    "MIN",
    "PREFIX",
    "QUANTILES",
    "STEP_METRIC",
    "SUM",
    "SUM_QUANTUM",
    "Gather",
    "Packed",
    "Reduced",
    "Schema",
    "Sink",
    "StepHook",
    "WandbSink",
    "free_port",
    "initialize_loopback",
    "process_count",
    "process_index",
    "process_mesh",
    "reduce",
    "reduce_in_step",
    "shard_map",
    "summary_for",
]
