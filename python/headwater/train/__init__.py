"""``headwater train``: the relational transformer trained on sampler batches.

Rooms: :mod:`.launcher` (one process, N loopback processes watched by
PID, or a process of a cluster job), :mod:`.rank` (one rank's run),
:mod:`.build` (what a rank builds before its first step: the model config,
the batch layout, the sinks), :mod:`.loop` (its step loop, validation and
checkpoint saves), :mod:`.prefetch` (the device prefetch thread),
:mod:`.shapes` (the step's shapes and FLOPs), :mod:`.records`
(``metrics.jsonl``, drain records, the progress line), :mod:`.step_rows`
(the per-step rows), :mod:`.summary` (the per-rank summary and profile),
:mod:`.verdict` (the live input verdict), :mod:`.throughput` (tokens/s and
MFU), :mod:`.endpoints` (exporter ports, the Prometheus ``file_sd`` file).

The model it trains, its optimiser and the device arrays it is fed are
:mod:`headwater.model`'s; the processes it runs in (joining a job, the
mesh, signals, the dead-rank watchdog) are :mod:`headwater.cluster`'s; its
config (the checked TOML file, ``--set``, where each value came from) is
:mod:`headwater.runconfig`'s, re-exported here (:class:`TrainConfig`,
:func:`load_config`, :func:`parse_overrides`, :func:`resolve_database`);
what it leaves on disk to be resumed (the launch record, orbax checkpoints,
the resume checks) is :mod:`headwater.rundir`'s; its validation and
evaluation passes, the padding every rank agrees on and ``headwater eval``
are :mod:`headwater.evaluation`'s. None of them imports this package.

Importing this package does not import JAX.
"""

from __future__ import annotations

from headwater.runconfig import TrainConfig, load_config, parse_overrides, resolve_database
from headwater.train.launcher import launch, run_directory

__all__ = [
    "TrainConfig",
    "launch",
    "load_config",
    "parse_overrides",
    "resolve_database",
    "run_directory",
]
