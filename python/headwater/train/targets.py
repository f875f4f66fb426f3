"""Where a batch's targets are and what each one is: each segment's
target position, which target slots are real, and each target's own
(per-sequence) task tensors — read by the model's decoder and loss
(:mod:`headwater.train.model`) and the evaluator."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp


def target_positions(batch: Mapping[str, jax.Array]) -> jax.Array:
    """``[B, K]`` position of each segment's target cell (``target_pos``)."""
    return batch["target_pos"].astype(jnp.int32)


def target_weights(batch: Mapping[str, jax.Array]) -> jax.Array:
    """``[B·K]`` 1.0 for a real target (slot below ``target_count``), else 0."""
    k = batch["target_pos"].shape[1]
    real = jnp.arange(k)[None, :] < batch["target_count"].astype(jnp.int32)[:, None]
    return real.reshape(-1).astype(jnp.float32)


def per_target(batch: Mapping[str, jax.Array], name: str) -> jax.Array:
    """``[B·K]`` int32: sequence ``q``'s ``seq_<name>`` for each of its
    ``K`` target slots (a sequence's segments share its task); a batch
    without the per-sequence form (built by hand) broadcasts ``<name>``."""
    b, k = batch["target_pos"].shape
    per_seq = batch.get(f"seq_{name}")
    if per_seq is None:
        per_seq = jnp.broadcast_to(batch[name][0], (b,))
    return jnp.repeat(per_seq.astype(jnp.int32), k)


def _at_target(x: jax.Array, pos: jax.Array) -> jax.Array:
    """``x [B, S, ...]`` at ``pos [B, K]``, flattened to ``[B·K, ...]``."""
    got = x[jnp.arange(x.shape[0])[:, None], pos]
    return got.reshape(-1, *got.shape[2:])
