"""The device-only train step per model preset (``headwater bench --model``).

One real batch of the database, padded once and cached on the device, is
stepped repeatedly: the forward pass (loss), forward + backward (loss and
gradients), and the full train step (with the optimiser update). Each is
compiled first, then timed ``rounds`` times (interleaved: forward, forward +
backward, step, forward, ...), the median kept. Reported per preset, as
JSON: the three times, backward/forward (``(fwd_bwd - fwd) / fwd``),
tokens/s of the step, model FLOPs and MFU (:mod:`.scale`; ``None`` where
the device's peak is unknown), and peak device memory where the backend
reports it (``memory_stats()``; ``None`` on a CPU). The sampler does not
run while timing: this is what the model costs, not the input pipeline.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

from headwater.errors import ConfigError
from headwater.model import scale
from headwater.train.throughput import throughput


def _model_config(name: str, overrides: Mapping[str, Any], meta: Mapping[str, Any]) -> Any:
    from headwater.model import transformer as M

    try:
        fields = {**scale.preset(name), **overrides}
        fields.setdefault("max_categories", M.max_categories(meta))
        return M.ModelConfig(**fields)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--model {name}: {e}") from None


def _timed(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds of each thunk over ``rounds`` interleaved calls."""
    for f in fns.values():
        jax.block_until_ready(f())  # compile
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return int(peak) if peak is not None else None


def bench_preset(
    name: str, sampler: Any, overrides: Mapping[str, Any], rounds: int
) -> dict[str, Any]:
    """One preset's figures on the next train batch of ``sampler``."""
    from headwater.model import device as DV
    from headwater.model import transformer as M
    from headwater.model.optim import OptConfig

    cfg = _model_config(name, overrides, sampler.database_metadata())
    raw = sampler.next_train_batch()
    b, s = raw["semantic_types"].shape
    batch = DV.batch_to_device(raw, max_categories=cfg.max_categories)
    col, cat = DV.tables_to_device(sampler.column_embeddings(), sampler.categorical_embeddings())
    params = M.init_params(0, cfg, int(col.shape[1]))
    opt = OptConfig(warmup_steps=0, total_steps=10)
    state = M.init_opt_state(params, opt)

    def loss(p: Any) -> Any:
        return M.loss_fn(p, batch, col, cat, cfg)[0]

    fwd, fwd_bwd = jax.jit(loss), jax.jit(jax.value_and_grad(loss))
    step = M.make_train_step(cfg, opt)
    t = _timed(
        {
            "forward": lambda: fwd(params),
            "forward_backward": lambda: fwd_bwd(params),
            "step": lambda: step(params, state, batch, col, cat)[2]["loss"],
        },
        rounds,
    )
    tp = throughput(cfg, b, s, 1.0 / t["step"])
    return {
        "preset": name,
        "model": dataclasses.asdict(cfg),
        "batch_size": b,
        "seq_len": s,
        "device": jax.devices()[0].device_kind,
        "rounds": rounds,
        "forward_ms": 1e3 * t["forward"],
        "forward_backward_ms": 1e3 * t["forward_backward"],
        "step_ms": 1e3 * t["step"],
        "backward_over_forward": (t["forward_backward"] - t["forward"]) / t["forward"],
        "tokens_per_second": tp["tokens_per_second"],
        "model_flops_per_step": tp["model_flops_per_step"],
        "mfu": tp["mfu"],
        "peak_memory_bytes": _peak_bytes(),
    }


def run_step_bench(
    sampler_path: Any,
    presets: list[str],
    batch_size: int,
    seq_len: int,
    overrides: Mapping[str, Any],
    rounds: int = 5,
) -> dict[str, Any]:
    """``{"step_bench": [one result per preset]}`` on one sampler's batches."""
    from headwater import _native

    for name in presets:
        if name not in scale.PRESETS:
            raise ConfigError(
                f"--model: {name!r} is not a preset (one of {', '.join(scale.PRESETS)})"
            )
    sampler = _native.Sampler(
        sampler_path, default_batch_size=batch_size, default_sequence_length=seq_len
    )
    try:
        return {"step_bench": [bench_preset(n, sampler, overrides, rounds) for n in presets]}
    finally:
        sampler.shutdown()


def parse_model_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` ``[model]`` overrides, values read as TOML (else strings)."""
    from headwater.runconfig.origins import toml_value

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--model-set {item!r}: expected KEY=VALUE")
        out[key.strip()] = toml_value(value)
    return out
