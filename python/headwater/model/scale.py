"""The model at scale: named presets of :class:`~headwater.model.transformer.ModelConfig`,
the rematerialisation policies, and the model FLOPs of a train step (what
a run's MFU divides by the devices' peak: :mod:`headwater.train.throughput`).

Presets (``[model] preset = "rt"``; keys set beside it override the
preset's): ``default`` is ``ModelConfig()`` as it is; ``rt`` is the RT
paper's size (d 256, 12 layers, 8 heads, d_ff 1024); ``rt-j`` RT-J's (d 512,
12 layers, 8 heads, d_ff 2048). The large ones use fused attention (at
``B = 32, S = 1024`` the dense ``[B, H, S, S]`` scores of ``rt`` do not fit
an 80 GB GPU).

FLOPs (:func:`train_flops_per_step`) count the matmuls only, 2 FLOPs per
multiply-add, forward × 3 for forward + backward (the backward does two
matmuls per forward matmul), with ``T = B·S`` tokens and ``N = B·K`` target
slots, per layer and attention kind (``A`` kinds):

* QKV and output projections: ``2·T·d·3d + 2·T·d·d = 8·T·d²``;
* scores and the weighted sum, dense over all ``S`` keys (what both the
  dense and the fused kernels compute): ``2·2·B·S²·d = 4·T·S·d``;
* the MLP (``f = mlp_ratio·d``): ``2·2·T·d·f = 4·T·d·f``;

plus the encoder's timestamp projection ``2·T·15·d``, the projection of
the frozen tables is not counted (it does not scale with the batch), and
the heads ``2·N·d·(d + 1 + 1 + 15 + 1) + 2·N·d·max_categories``. One-hot
reads of small tables are not counted (a gather's work, done as a matmul).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

#: ``ModelConfig.remat`` values (:func:`remat`).
REMAT_POLICIES = ("none", "full", "dots_saveable")

#: Model presets: ``ModelConfig`` fields by name.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "rt": {
        "d_model": 256,
        "num_layers": 12,
        "num_heads": 8,
        "mlp_ratio": 4,
        "attention_impl": "fused",
    },
    "rt-j": {
        "d_model": 512,
        "num_layers": 12,
        "num_heads": 8,
        "mlp_ratio": 4,
        "attention_impl": "fused",
    },
}


def remat(fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
    """``fn`` (one layer) under ``jax.checkpoint`` with ``policy``: ``full``
    recomputes it in the backward pass, ``dots_saveable`` keeps its matmul
    outputs, ``none`` leaves it as it is."""
    if policy == "full":
        return jax.checkpoint(fn)
    if policy == "dots_saveable":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_saveable)
    return fn


def preset(name: str) -> dict[str, Any]:
    """The ``ModelConfig`` fields of preset ``name`` (a ``ValueError`` naming
    the allowed ones otherwise)."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}")
    return dict(PRESETS[name])


def train_flops_per_step(cfg: Any, batch: int, seq_len: int, targets_per_seq: int = 1) -> float:
    """Model FLOPs of one forward + backward over ``batch`` sequences of
    ``seq_len`` cells (the formula in the module docstring)."""
    d, f = cfg.d_model, cfg.d_model * cfg.mlp_ratio
    t = batch * seq_len
    n = batch * targets_per_seq
    attn = len(cfg.attention) * (8 * t * d * d + 4 * t * seq_len * d)
    mlp = 4 * t * d * f
    encoder = 2 * t * 15 * d
    heads = 2 * n * d * (d + 18) + 2 * n * d * cfg.max_categories
    return 3.0 * (cfg.num_layers * (attn + mlp) + encoder + heads)
