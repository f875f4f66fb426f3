"""Where a batch's targets are and what each one is — read by the model's
decoder and loss (:mod:`headwater.model.transformer`) and the evaluator.

A sequence has ``K + M`` target slots: ``K`` segment targets (the seeds'
target cells, ``target_pos``, real below ``target_count``) and ``M``
masked cells (``mask_pos``, real below ``mask_count``; ``M = 0`` without
``mask_prob_max``). Targets are flattened sequence-major to ``N = B·(K+M)``.
A segment target has its sequence's task: type ``seq_target_stype`` and
categorical window ``seq_cat_emb_start`` / ``seq_cat_emb_count`` (a batch
may mix tasks). A masked cell has its own: its ``semantic_types`` entry and
its column's window (``mask_cat_start`` / ``mask_cat_count``)."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

#: Per masked slot, the tensor that gives what ``per_target`` asks for.
_MASKED = {"cat_emb_start": "mask_cat_start", "cat_emb_count": "mask_cat_count"}


def _masked(batch: Mapping[str, jax.Array]) -> bool:
    return "mask_pos" in batch and batch["mask_pos"].shape[1] > 0


def target_positions(batch: Mapping[str, jax.Array]) -> jax.Array:
    """``[B, K+M]`` position of each target cell: the segments' targets
    (``target_pos``), then the masked cells (``mask_pos``)."""
    pos = batch["target_pos"].astype(jnp.int32)
    if _masked(batch):
        pos = jnp.concatenate([pos, batch["mask_pos"].astype(jnp.int32)], axis=1)
    return pos


def target_weights(batch: Mapping[str, jax.Array]) -> jax.Array:
    """``[B·(K+M)]`` 1.0 for a real target (a segment slot below
    ``target_count``, a masked slot below ``mask_count``), else 0."""
    k = batch["target_pos"].shape[1]
    real = jnp.arange(k)[None, :] < batch["target_count"].astype(jnp.int32)[:, None]
    if _masked(batch):
        m = batch["mask_pos"].shape[1]
        masked = jnp.arange(m)[None, :] < batch["mask_count"].astype(jnp.int32)[:, None]
        real = jnp.concatenate([real, masked], axis=1)
    return real.reshape(-1).astype(jnp.float32)


def per_target(batch: Mapping[str, jax.Array], name: str) -> jax.Array:
    """``[B·(K+M)]`` int32 ``name`` (``target_stype``, ``cat_emb_start`` or
    ``cat_emb_count``) of each target: sequence ``q``'s ``seq_<name>`` for
    its ``K`` segment slots (a sequence's segments share its task), each
    masked cell's own for its ``M`` slots. A batch without the per-sequence
    form (built by hand) broadcasts ``<name>``."""
    b, k = batch["target_pos"].shape
    per_seq = batch.get(f"seq_{name}")
    if per_seq is None:
        per_seq = jnp.broadcast_to(batch[name][0], (b,))
    out = jnp.broadcast_to(per_seq.astype(jnp.int32)[:, None], (b, k))
    if _masked(batch):
        if name == "target_stype":
            own = _at(batch["semantic_types"], batch["mask_pos"].astype(jnp.int32))
        else:
            own = batch[_MASKED[name]]
        out = jnp.concatenate([out, own.astype(jnp.int32)], axis=1)
    return out.reshape(-1)


def _at(x: jax.Array, pos: jax.Array) -> jax.Array:
    """``x [B, S, ...]`` at ``pos [B, J]``: ``[B, J, ...]``."""
    return x[jnp.arange(x.shape[0])[:, None], pos]


def _at_target(x: jax.Array, pos: jax.Array) -> jax.Array:
    """``x [B, S, ...]`` at ``pos [B, J]``, flattened to ``[B·J, ...]``."""
    got = _at(x, pos)
    return got.reshape(-1, *got.shape[2:])
