"""A run's throughput: tokens per second, the model FLOPs of its steps over
the devices' peak (MFU), the per-step ``trainer/mfu`` row and the summary's
line.

The FLOP count of a step is the model's
(:func:`headwater.model.scale.train_flops_per_step`); what is here is the
devices' dense bfloat16 peak (:data:`PEAK_FLOPS`) and the ratio. A device
whose peak is not listed (a CPU) has no MFU: absent from the rows, ``None``
in the summary, never 0 or NaN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from headwater.model.scale import train_flops_per_step

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
