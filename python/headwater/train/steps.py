"""The jitted train and eval steps of :mod:`headwater.train.model` (which
re-exports them), and gradient accumulation (seed 000 §10).

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
import optax
from jax import lax

from headwater import _native
from headwater.train.optim import OptConfig, make_optimizer

#: Batch tensors with one row per sequence (split by gradient accumulation).
PER_SEQUENCE_KEYS = frozenset(
    t["name"] for t in _native.batch_tensors() if t["shape"] and t["shape"][0] == "B"
)

StepFn = Any


def init_opt_state(params: Any, opt_cfg: OptConfig) -> Any:
    return make_optimizer(opt_cfg).init(params)


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
    grad_fn: Any, params: Any, batch: dict[str, jax.Array], parts: int
) -> tuple[Any, dict[str, jax.Array]]:
    """``(grads, metrics)`` of ``batch`` as ``parts`` micro-batches (see the
    module docstring); ``grad_fn(params, batch)`` returns ``((loss, metrics),
    grads)``."""
    from headwater.train.model import target_weights

    if parts == 1:
        (_, metrics), grads = grad_fn(params, batch)
        return grads, metrics
    micro, shared = split_batch(batch, parts)

    def body(acc: Any, mb: dict[str, jax.Array]) -> tuple[Any, None]:
        full = {**shared, **mb}
        (_, metrics), grads = grad_fn(params, full)
        w = jnp.sum(target_weights(full))
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


@functools.cache
def make_train_step(
    model_cfg: Any,
    opt_cfg: OptConfig,
    axis_name: str | None = None,
    *,
    donate: bool = False,
    grad_accum: int = 1,
) -> StepFn:
    """A jitted ``(params, opt_state, batch, col_emb, cat_emb) -> (params, opt_state, metrics)``.

    With ``axis_name``, gradients, loss and metrics are averaged with
    ``lax.pmean`` over that axis (call it under ``shard_map``/``pmap``/
    ``vmap`` binding the name); clipping and the update then see the mean.
    ``donate`` donates ``params`` and ``opt_state`` buffers to the update.
    ``grad_accum`` micro-batches per step (one update; the module docstring).
    Cached per argument set (configs are frozen), so callers share one
    compiled step per batch shape.
    """
    from headwater.train.model import loss_fn

    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    tx = make_optimizer(opt_cfg)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(
        params: Any, opt_state: Any, batch: Any, col_emb: jax.Array, cat_emb: jax.Array
    ) -> tuple[Any, Any, Any]:
        def grads_of(p: Any, b: Any) -> Any:
            return grad_fn(p, b, col_emb, cat_emb, model_cfg)

        grads, metrics = accumulated_grads(grads_of, params, batch, grad_accum)
        if axis_name is not None:
            grads = lax.pmean(grads, axis_name)
            metrics = lax.pmean(metrics, axis_name)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        return params, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


@functools.cache
def make_eval_step(model_cfg: Any, axis_name: str | None = None) -> StepFn:
    """A jitted ``(params, batch, col_emb, cat_emb) -> metrics`` (no update)."""
    from headwater.train.model import loss_fn

    def step(params: Any, batch: Any, col_emb: jax.Array, cat_emb: jax.Array) -> Any:
        _, metrics = loss_fn(params, batch, col_emb, cat_emb, model_cfg)
        if axis_name is not None:
            metrics = lax.pmean(metrics, axis_name)
        return metrics

    return jax.jit(step)
