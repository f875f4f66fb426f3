"""The categorical head's logits in bounded memory (read by
:func:`headwater.model.transformer.forward`).

Each of the ``N = B·(K+M)`` targets (:mod:`headwater.model.targets`) is
scored against its own window of ``C = max_categories`` rows of the
projected category table ``T [V, d]``: ``logits[n, c] = q[n] · T[start[n] +
c] / sqrt(d)``, slots ``c >= count[n]`` set to ``-1e9``. Gathering every
window at once (:func:`gathered_logits`, the reference) holds ``[N, C, d]``
float32, and the backward keeps it as a residual: with masked cells as
targets that is ``B·(1+M)·C·d·4`` bytes, 2.0 GiB at RT-J's ``B 32, S 1024,
M 512, d 512`` for ``C = 64``, 32 GiB for ``C = 1024``.

:func:`window_logits` scores the targets in chunks instead: a ``lax.map``
over chunks of at most ``chunk_mib`` MiB, each chunk's body under
``jax.checkpoint``, so the backward recomputes a chunk rather than saving
it. The step holds the ``[N, C]`` logits and one chunk, whatever ``N`` is;
the table's gradient is a ``[V, d]`` carry, the table's own size. A chunk
is scored one of two ways (``impl``), the same products and sums as the
reference, so values and gradients agree to float rounding:

* ``gather`` (:func:`gathered_logits`): the chunk's ``[chunk, C, d]``
  windows. Its backward is a scatter-add into ``C`` rows per window.
* ``matmul`` (:func:`matmul_logits`): ``q @ T.T`` over all ``V`` rows,
  ``[chunk, V]``, then each window taken from its row: ``V / C`` times
  the products, but matmuls both ways and ``V`` floats per target, not
  ``C·d``. ``auto`` takes it when ``V <= C·d / 8`` (:func:`pick_impl`).

Measured (the head's forward + backward, XLA's temporaries, on a 2-core
CPU at a load average of 1 to 3, so times are rough; ``N`` 2056, ``C`` 152, ``d`` 256; ``scripts/cat_head_memory.py`` and
``docs/training.md``): all windows at once 613 MiB, 188 ms; gather in 64
MiB chunks 127 MiB, 77 ms; matmul with TPC-H's ``V`` 279: 4.8 MiB, 2.3 ms,
with ``V`` 4096: 39 MiB, 42 ms; with ``V`` 32768 unchunked: 289 MiB,
347 ms, where gather chunks took 90 ms (so ``auto`` switches there).
Ruled out: ``cand`` in bfloat16 (614 MiB: still ``O(N·C·d)``, the product
promotes it back); ``sum(q[:, None] * cand, -1)`` (916 MiB: the fusion
XLA may find does not bound the backward); one matmul per distinct window
(their number is not static: any categorical column can be masked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from headwater.model.attention import MASK_FILL

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
