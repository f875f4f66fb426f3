"""The categorical head's logits in bounded memory (read by
:func:`headwater.train.model.forward`).

Each of the ``N = B·(K+M)`` targets (:mod:`headwater.train.targets`) is
scored against its own window of ``C = max_categories`` rows of the
projected category table ``T [V, d]``: ``logits[n, c] = q[n] · T[start[n] +
c] / sqrt(d)``, slots ``c >= count[n]`` set to ``-1e9``. Gathering every
window at once (:func:`gathered_logits`, the reference) holds ``[N, C, d]``
float32, and the backward keeps it as a residual: with masked cells as
targets that is ``B·(1+M)·C·d·4`` bytes, 2.2 GB at RT-J's ``B 32, S 1024,
M 512, d 512`` for ``C = 64``, 34 GB for ``C = 1024``.

:func:`window_logits` scores the targets in chunks instead: a ``lax.map``
over chunks of at most ``chunk_mib`` MiB of windows, each chunk's body under
``jax.checkpoint``, so the backward regathers a chunk's windows rather than
saving them. The step holds the ``[N, C]`` logits and one chunk's ``[chunk,
C, d]``, whatever ``N`` is; the table's gradient is a ``[V, d]`` carry, the
table's own size. Each logit is the same product and sum as the
reference's (chunks only split ``N``), so values and gradients agree to
float rounding.

Alternatives (measured on a CPU, see ``docs/training.md``, "Categorical
head memory"):

* ``q @ T.T`` then each target's window from the ``[N, V]`` scores: ``V``
  counts every category of every categorical column (of every database in
  a mixture), so it is ``N·V`` floats, unbounded, and ``V / C`` times the
  work of the windows; chunked, it keeps that extra work for the same bound.
* A one-hot or segment formulation over the distinct windows of a batch:
  their number is not static (any categorical column can be masked), so
  it is ``[N, V]`` again or one compilation per batch.
* ``cand`` in bfloat16: half the bytes, still ``O(N·C·d)``.
* ``sum(q[:, None] * cand, -1)`` instead of the einsum: XLA may fuse the
  gather into the reduction, but the backward's residual is up to the
  compiler; the chunks bound it by construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from headwater.train.attention import MASK_FILL

MIB = 1 << 20
#: Default of ``ModelConfig.cat_chunk_mib``: at ``C·d = 64·512`` 512 targets
#: per chunk, 33 chunks at RT-J's ``N = 32·513``.
CAT_CHUNK_MIB = 64
#: ``ModelConfig.cat_head_impl`` values.
CAT_HEAD_IMPLS = ("auto", "gather", "matmul")
#: ``auto`` takes the matmul when a target's ``V`` scores are at most this
#: share of its ``C·d`` window floats.
MATMUL_SHARE = 1 / 8


def max_categories(metadata: Mapping[str, Any], multiple: int = 8) -> int:
    """The window size ``C``: the most categories of any column in
    ``database_metadata()``, rounded up to ``multiple``."""
    counts = [int(c.get("cat_emb_count", 0)) for c in metadata.get("columns", [])]
    k = max([1, *counts])
    return -(-k // multiple) * multiple


def pick_impl(impl: str, rows: int, size: int, d: int) -> str:
    """``gather`` or ``matmul`` for a table of ``rows`` rows, windows of
    ``size`` and width ``d`` (``impl`` other than ``auto`` is kept)."""
    if impl != "auto":
        return impl
    return "matmul" if rows <= MATMUL_SHARE * size * d else "gather"


def chunk_targets(floats: int, chunk_mib: int) -> int:
    """Targets per chunk: as many as fit in ``chunk_mib`` MiB at ``floats``
    float32 each, at least one; ``chunk_mib = 0``: no limit."""
    if chunk_mib == 0:
        return 1 << 62
    return max(1, chunk_mib * MIB // (floats * 4))


def _rows(start: jax.Array, size: int, rows: int) -> jax.Array:
    """``[n, size]`` table rows of each window, clipped to the table."""
    return jnp.clip(start.astype(jnp.int32)[:, None] + jnp.arange(size)[None], 0, rows - 1)


def gathered_logits(q: jax.Array, table: jax.Array, start: jax.Array, size: int) -> jax.Array:
    """``[n, size]`` float32 ``q[i] · table[start[i] + c]`` (rows clipped to
    the table), through the gathered windows ``[n, size, d]`` at once."""
    cand = jnp.take(table, _rows(start, size, len(table)), axis=0).astype(jnp.float32)
    return jnp.einsum("nd,ncd->nc", q, cand)


def matmul_logits(q: jax.Array, table: jax.Array, start: jax.Array, size: int) -> jax.Array:
    """:func:`gathered_logits` through every row's score ``q @ table.T``
    ``[n, V]``, each target's window then taken from its row."""
    # The barrier keeps XLA from reassociating q @ (unit_rms(E) @ W).T into
    # (q @ W.T) @ unit_rms(E).T, which skips the table's rounding to the
    # compute dtype (2e-3 apart from the gather in bfloat16, on a CPU).
    # HIGHEST: float32 products, as the gather's, where the default is TF32.
    t = lax.optimization_barrier(table).astype(jnp.float32)
    scores = jnp.dot(q, t.T, precision=lax.Precision.HIGHEST)
    return jnp.take_along_axis(scores, _rows(start, size, len(table)), axis=1)


def window_logits(
    q: jax.Array, table: jax.Array, start: jax.Array, size: int, chunk_mib: int, impl: str
) -> jax.Array:
    """The logits of ``q [N, d]`` by ``impl`` (:func:`pick_impl`), holding at
    most one chunk of :func:`chunk_targets` windows or score rows, forward
    and backward."""
    n, d = q.shape
    impl = pick_impl(impl, len(table), size, d)
    logits = matmul_logits if impl == "matmul" else gathered_logits
    most = chunk_targets(len(table) if impl == "matmul" else size * d, chunk_mib)
    if n <= most:
        return logits(q, table, start, size)
    k = -(-n // most)  # chunks
    chunk = -(-n // k)  # the fewest targets per chunk for k chunks: < k of padding
    pad = k * chunk - n
    qs = jnp.pad(q, ((0, pad), (0, 0))).reshape(k, chunk, d)
    starts = jnp.pad(start.astype(jnp.int32), (0, pad)).reshape(k, chunk)

    def one(xs: tuple[jax.Array, jax.Array]) -> jax.Array:
        return logits(xs[0], table, xs[1], size)

    # prevent_cse=False: inside a scan the recomputation cannot be merged
    # with the forward anyway (JAX's advice for checkpoint under scan).
    out = lax.map(jax.checkpoint(one, prevent_cse=False), (qs, starts))
    return out.reshape(k * chunk, size)[:n]


def categorical_logits(
    q: jax.Array,
    table: jax.Array,
    start: jax.Array,
    count: jax.Array,
    size: int,
    chunk_mib: int,
    impl: str = "auto",
) -> jax.Array:
    """The head's ``[N, size]`` float32 logits: :func:`window_logits` over
    ``sqrt(d)``, slots ``>= count`` set to ``MASK_FILL``."""
    logits = window_logits(q, table, start, size, chunk_mib, impl) / math.sqrt(q.shape[1])
    return jnp.where(jnp.arange(size)[None] < count[:, None], logits, MASK_FILL)
