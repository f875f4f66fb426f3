"""``headwater train``: the relational transformer trained on sampler batches.

Rooms: :mod:`.config` (the checked TOML config), :mod:`.launcher` (one or N
loopback processes, watched by PID), :mod:`.loop` (one rank's step loop and
validation), :mod:`.mesh` (data-parallel plumbing), :mod:`.padder` (the
shapes every rank feeds the step), :mod:`.records`
(``metrics.jsonl``, drain records, the progress line), :mod:`.summary` (the
per-rank summary and profile), :mod:`.checkpoint` (orbax checkpoints,
``--resume``, the run's launch record), :mod:`.stopping` (SIGTERM/SIGINT:
acknowledged at once, stop after the step), :mod:`.watchdog` (a lost rank
named within ``train.peer_timeout_s``), :mod:`.throughput` (tokens/s and
MFU). The model it trains, its optimiser and the device arrays it is fed
are :mod:`headwater.model`'s.

Importing this package does not import JAX.
"""

from __future__ import annotations

from headwater.train.config import TrainConfig, load_config, parse_overrides
from headwater.train.launcher import launch, resolve_database, run_directory

__all__ = [
    "TrainConfig",
    "launch",
    "load_config",
    "parse_overrides",
    "resolve_database",
    "run_directory",
]
