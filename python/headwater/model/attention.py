"""The model's attention: the boolean masks of each attention kind, built
once per forward pass from the batch (:func:`attention_masks`), and one
QK-normalised multi-head attention over a mask (:func:`_attention`), in
float32 from the projections on. What a block does around it (pre-norm,
residual, the scan over kinds, the MLP) is :mod:`headwater.model.transformer`'s;
the architecture is described there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

#: The score of a masked-out key (and the logit of a category out of range).
MASK_FILL = -1e9
#: Every attention kind a block may run (``ModelConfig.attention``).
ATTENTION_KINDS = ("column", "feature", "outbound", "inbound", "neighbour")


def _l2_normalize(x: jax.Array) -> jax.Array:
    """``x / max(||x||, 1e-6)`` with a gradient that is finite at ``x = 0``."""
    return x * lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-12))


def attention_masks(batch: Mapping[str, jax.Array], kinds: tuple[str, ...]) -> dict[str, jax.Array]:
    """Boolean masks ``[B, S, S]`` (query i, key j) for each attention kind.

    ``mask[b, i, j]`` is the relation of the kind between cells i and j, and
    both i and j non-padding; or ``i == j``.
    """
    valid = batch["is_padding"] == 0
    rows = batch["seq_row_ids"].astype(jnp.int32)
    s = rows.shape[1]
    both_valid = valid[:, :, None] & valid[:, None, :]
    eye = jnp.eye(s, dtype=jnp.bool_)[None]
    out_rel = None
    if any(k in kinds for k in ("outbound", "inbound", "neighbour")):
        adj = batch["fk_adj"] != 0
        # out_rel[b, i, j] = fk_adj[b, rows[b, i], rows[b, j]]
        out_rel = jax.vmap(lambda a, r: a[r][:, r])(adj, rows)
    masks = {}
    for kind in kinds:
        if kind == "column":
            col = batch["column_ids"]
            seg = batch["segment_ids"]
            rel = (col[:, :, None] == col[:, None, :]) & (seg[:, :, None] == seg[:, None, :])
        elif kind == "feature":
            rel = rows[:, :, None] == rows[:, None, :]
        else:
            assert out_rel is not None
            if kind == "outbound":
                rel = out_rel
            elif kind == "inbound":
                rel = jnp.swapaxes(out_rel, 1, 2)
            else:
                rel = out_rel | jnp.swapaxes(out_rel, 1, 2)
        masks[kind] = (rel & both_valid) | eye
    return masks


#: ``ModelConfig.attention_impl`` values: ``dense`` is the masked float32
#: einsum (the reference), ``fused`` is ``jax.nn.dot_product_attention`` on the
#: same boolean masks.
ATTENTION_IMPLS = ("dense", "fused")


def _fused_backend(dt: jnp.dtype) -> Literal["cudnn"] | None:
    """cuDNN where it applies (a GPU, 16-bit inputs); else ``None``: JAX's
    choice (XLA in JAX 0.10, which never picks cuDNN on its own)."""
    if jax.default_backend() == "gpu" and dt in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return None


def _attention(
    wqkv: jax.Array,
    wo: jax.Array,
    qk_scale: jax.Array,
    x: jax.Array,
    mask: jax.Array,
    num_heads: int,
    dt: jnp.dtype,
    impl: str = "dense",
) -> jax.Array:
    """``x [B, S, d]`` attended over ``mask [B, S, S]`` by ``num_heads`` heads
    of ``d / num_heads``; projections in ``dt``, scores and softmax in float32.

    ``impl = "fused"``: the normalised ``q``, ``k`` and ``v`` are cast to
    ``dt`` and go to ``jax.nn.dot_product_attention`` (logits and softmax
    statistics in float32 there too; the probabilities meet ``v`` in ``dt``).
    A query whose mask row is all False (never from :func:`attention_masks`,
    which always allows the diagonal) gets a zero output on both paths."""
    b, s, d = x.shape
    h, dh = num_heads, d // num_heads
    qkv = jnp.einsum("bsd,kde->kbse", x, wqkv.astype(dt))
    q, k, v = (t.reshape(b, s, h, dh).astype(jnp.float32) for t in qkv)
    q = _l2_normalize(q) * qk_scale[None, None, :, None]
    k = _l2_normalize(k)
    if impl == "fused":
        o = jax.nn.dot_product_attention(
            q.astype(dt),
            k.astype(dt),
            v.astype(dt),
            mask=mask[:, None],
            scale=1.0,
            implementation=_fused_backend(dt),
        )
    else:
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        scores = jnp.where(mask[:, None], scores, MASK_FILL)
        probs = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    any_key = jnp.any(mask, axis=-1)[:, :, None, None]
    o = jnp.where(any_key, o, 0).astype(dt).reshape(b, s, d)
    return o @ wo.astype(dt)
