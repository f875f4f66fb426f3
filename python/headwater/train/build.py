"""What a :class:`~headwater.train.loop.Trainer` is built from, apart from
its state: the model config (the category count read from the database
when ``auto_categories``), how the global batch is laid out over the mesh
(checked: a rank's batch must split over its local devices), and the sinks
that every step's rows go to (``metrics.jsonl`` on rank 0, the drain
recorder, W&B, and the telemetry hook that feeds them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwater.cluster.mesh import Mesh
from headwater.errors import ConfigError
from headwater.runconfig.config import TrainConfig
from headwater.rundir import checkpoint as C
from headwater.train.records import DrainRecorder, JsonlSink

if TYPE_CHECKING:
    from headwater.model.transformer import ModelConfig


def model_config(cfg: TrainConfig, sampler: Any) -> ModelConfig:
    """``[model]``, its ``max_categories`` read from the database when the
    config asks for it (``auto_categories``)."""
    from headwater.model import transformer as M

    if not cfg.auto_categories:
        return cfg.model
    meta = sampler.database_metadata()
    return dataclasses.replace(cfg.model, max_categories=M.max_categories(meta))


def batch_layout(cfg: TrainConfig, rank: int, mesh: Mesh, streams: int) -> dict[str, Any]:
    """How the global batch is formed from ``streams`` sampler batches per
    process (stated in the run summary); a batch size that does not split
    over the process's local devices is a :class:`ConfigError`."""
    b = int(cfg.sampler_kwargs(rank).get("default_batch_size", 0))
    per = mesh.devices_per_stream
    if b % per:
        raise ConfigError(
            f"{cfg.where('sampler', 'default_batch_size')}: default_batch_size = {b} does "
            f"not split over this process's {per} local devices; use a multiple of {per}"
        )
    layout = {
        "per_process_batch": b * streams,
        "local_devices": mesh.local_devices,
        "per_device_batch": b // per,
        "devices": mesh.devices,
        "processes": mesh.world,
        "global_batch": b // per * mesh.devices,
        "platform": mesh.platform,
    }
    return layout | varlen_layout(cfg, rank, mesh)


def varlen_layout(cfg: TrainConfig, rank: int, mesh: Mesh) -> dict[str, Any]:
    """With ``sampler.sequence_lengths``: the token budget and the global
    batch of each ``S`` (the core's ``B``, ``step_shapes()``, split
    over the local devices; a ``B`` that does not split is a
    :class:`ConfigError`). The ``default_batch_size`` layout above is then
    the val stream's and the evaluation passes' (they keep the fixed shape)."""
    from headwater import _native

    kw = cfg.sampler_kwargs(rank)
    tokens = kw.get("tokens_per_batch")
    if not kw.get("sequence_lengths") or tokens is None:
        return {}
    per = mesh.devices_per_stream
    by_length = {}
    for shape in _native.step_shapes(kw)["train"]:
        s, b = shape["S"], shape["B"]
        if b % per:
            raise ConfigError(
                f"{cfg.where('sampler', 'tokens_per_batch')}: tokens_per_batch = {tokens} gives "
                f"B = {b} sequences of S = {s}, which do not split over this process's {per} "
                f"local devices; make tokens_per_batch / S a multiple of {per} for every S"
            )
        by_length[str(s)] = b // per * mesh.devices
    return {"tokens_per_batch": int(tokens), "global_batch_by_length": by_length}


def open_sinks(
    cfg: TrainConfig, sampler: Any, run_dir: Path, rank: int, run: Any, resumed_at: int | None
) -> tuple[JsonlSink | None, DrainRecorder | None, Any]:
    """``(metrics.jsonl, drain recorder, telemetry hook)``: the JSONL sink on
    rank 0 (``logging.jsonl``; on resume from step ``resumed_at`` the rows
    after it are dropped and the file appended to), the drain recorder
    (``logging.record_drains``), and the step hook that drains the sampler
    (through the recorder, if any) into W&B (``run``) and the JSONL sink."""
    from headwater import telemetry as T

    lg, lead = cfg.logging, rank == 0
    if lead and lg.jsonl and resumed_at is not None:
        C.truncate_jsonl(
            run_dir / "metrics.jsonl", resumed_at, final_phase=resumed_at == cfg.train.steps
        )
    jsonl = (
        JsonlSink(run_dir / "metrics.jsonl", append=resumed_at is not None)
        if lead and lg.jsonl
        else None
    )
    drains = (
        DrainRecorder(sampler, run_dir / f"drains-rank{rank}.jsonl") if lg.record_drains else None
    )
    sinks: list[Any] = []
    if run is not None:
        from headwater.telemetry import WandbSink

        sinks.append(WandbSink(run))
    if jsonl is not None:
        sinks.append(jsonl)
    hook = T.StepHook(drains or sampler, sinks=sinks, buffered=cfg.train.buffered_telemetry)
    return jsonl, drains, hook
