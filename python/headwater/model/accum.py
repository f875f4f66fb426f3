"""Gradient accumulation (docs/training.md) for the train step of
:mod:`headwater.model.transformer`.

``grad_accum = G``: the batch's per-sequence tensors (leading dimension
``B``, as ``_native.batch_tensors()`` lists them) are split into ``G``
micro-batches of ``B / G`` sequences; the batch-wide tensors (the text
table, the task's scalars) go to every micro-batch. A ``lax.scan`` runs
forward + backward per micro-batch, so only one micro-batch's activations
are alive at a time. Gradients and metrics are averaged weighted by each
micro-batch's real targets: the loss is a mean over real targets, so the
averaged gradient is the gradient of the large batch's loss, and the one
optimiser update equals the large batch's (up to float summation order).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from headwater import _native

#: Batch tensors with one row per sequence (split by gradient accumulation).
PER_SEQUENCE_KEYS = frozenset(
    t["name"] for t in _native.batch_tensors() if t["shape"] and t["shape"][0] == "B"
)


def split_batch(batch: dict[str, jax.Array], parts: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(micro, shared)``: per-sequence tensors reshaped to ``[parts, B / parts,
    ...]`` and the batch-wide ones."""
    micro, shared = {}, {}
    for k, v in batch.items():
        if k in PER_SEQUENCE_KEYS:
            micro[k] = v.reshape(parts, v.shape[0] // parts, *v.shape[1:])
        else:
            shared[k] = v
    return micro, shared


def accumulated_grads(
    grad_fn: Any, weight_fn: Any, params: Any, batch: dict[str, jax.Array], parts: int
) -> tuple[Any, dict[str, jax.Array]]:
    """``(grads, metrics)`` of ``batch`` as ``parts`` micro-batches (see the
    module docstring); ``grad_fn(params, batch)`` returns ``((loss, metrics),
    grads)``, ``weight_fn(batch)`` the ``[N]`` weights of its targets."""
    if parts == 1:
        (_, metrics), grads = grad_fn(params, batch)
        return grads, metrics
    micro, shared = split_batch(batch, parts)

    def body(acc: Any, mb: dict[str, jax.Array]) -> tuple[Any, None]:
        full = {**shared, **mb}
        (_, metrics), grads = grad_fn(params, full)
        w = jnp.sum(weight_fn(full))
        g_acc, m_acc, w_acc = acc
        g_acc = jax.tree.map(lambda a, g: a + w * g, g_acc, grads)
        m_acc = jax.tree.map(lambda a, m: a + w * m, m_acc, metrics)
        return (g_acc, m_acc, w_acc + w), None

    first = {**shared, **jax.tree.map(lambda v: v[0], micro)}
    _, m_shape = jax.eval_shape(grad_fn, params, first)[0]
    zeros = functools.partial(jax.tree.map, lambda x: jnp.zeros(x.shape, x.dtype))
    init = (zeros(params), zeros(m_shape), jnp.zeros((), jnp.float32))
    (g_sum, m_sum, w_sum), _ = lax.scan(body, init, micro)
    inv = 1.0 / jnp.maximum(w_sum, 1.0)
    return jax.tree.map(lambda g: g * inv, g_sum), jax.tree.map(lambda m: m * inv, m_sum)
