"""The model at scale: named presets of :class:`~headwater.model.transformer.ModelConfig`,
the rematerialisation policies, and the model FLOPs of a train step over
a device's peak (MFU).

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

from collections.abc import Callable, Mapping
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

#: Dense (not sparse) bfloat16 peak FLOP/s by ``jax.Device.device_kind``
#: prefix (vendor data sheets). A device not listed (a CPU) has no MFU.
PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989e12,  # H100 SXM
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
    "TPU v5 lite": 197e12,
    "TPU v5p": 459e12,
    "TPU v4": 275e12,
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


def peak_flops(device_kind: str) -> float | None:
    """Peak FLOP/s of a device kind (longest matching prefix), or ``None``."""
    hits = [k for k in PEAK_FLOPS if device_kind.startswith(k)]
    return PEAK_FLOPS[max(hits, key=len)] if hits else None


def mfu(flops_per_step: float, steps_per_second: float, devices: int, kind: str) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the devices' peak."""
    peak = peak_flops(kind)
    if peak is None or not steps_per_second > 0:
        return None
    return flops_per_step * steps_per_second / (peak * devices)


def mfu_row(
    flops_per_step: float, step_seconds: float, devices: int, kind: str
) -> dict[str, float]:
    """``{"trainer/mfu": ...}`` of a step that took ``step_seconds`` (the
    W&B row and the trainer gauge), empty where the device's peak is
    unknown (a CPU): absent, never 0 or NaN."""
    value = mfu(flops_per_step, 1.0 / step_seconds if step_seconds > 0 else 0.0, devices, kind)
    return {} if value is None else {"trainer/mfu": value}


def throughput(
    cfg: Any,
    global_batch: int,
    seq_len: int,
    steps_per_second: float,
    shapes: Mapping[tuple[int, int], int] | None = None,
) -> dict[str, Any]:
    """The run summary's ``throughput``: tokens/s, model FLOPs per step and
    MFU over the local devices' peak (``None`` where the peak is unknown,
    as on a CPU). ``shapes``: steps trained per global ``(B, S)`` (variable
    length); tokens and FLOPs per step are then their means over the steps
    run, not those of ``global_batch × seq_len``."""
    devices = jax.devices()
    kind = devices[0].device_kind if devices else "unknown"
    if shapes and sum(shapes.values()) > 0:
        n = sum(shapes.values())
        tokens = sum(b * s * k for (b, s), k in shapes.items()) / n
        flops = sum(train_flops_per_step(cfg, b, s) * k for (b, s), k in shapes.items()) / n
    else:
        tokens = global_batch * seq_len
        flops = train_flops_per_step(cfg, global_batch, seq_len)
    return {
        "tokens_per_second": tokens * steps_per_second,
        "model_flops_per_step": flops,
        "device_kind": kind,
        "peak_flops_per_device": peak_flops(kind),
        "mfu": mfu(flops, steps_per_second, len(devices), kind),
    }


def format_throughput(t: dict[str, Any]) -> str:
    """One summary line: tokens/s, FLOPs per step and MFU (or why not)."""
    head = (
        f"  {t['tokens_per_second']:,.0f} tokens/s, "
        f"{t['model_flops_per_step'] / 1e9:.2f} GFLOP per step (model FLOPs, fwd+bwd)"
    )
    if t["mfu"] is None:
        return f"{head}; MFU not known (no peak FLOP/s for {t['device_kind']!r})"
    return f"{head}; MFU {100 * t['mfu']:.1f}% of {t['device_kind']} bf16 peak"
