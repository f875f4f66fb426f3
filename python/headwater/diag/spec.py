"""The ``[diag]`` section of a diagnostic config: what its run must light.

A ``[diag]`` section::

    [diag]
    description = "what this config twists and what should happen"
    processes = 2                    # local processes (cross-rank pathologies)
    skip = 10                        # warm-up steps left out of every statistic
    [[diag.expect]]
    signal = "pool/remaining_min"
    band = [0.0, 0.01]               # the statistic's lit band
    culprit_rank = 1                 # optional

A signal whose state depends on the host running the config (the share of
a step spent waiting, on a loaded 2-core machine or an idle 64-core one)
is listed in ``host_dependent = ["queue/wait_seconds"]`` instead: its run
passes lit or unlit, and the report says which. A signal cannot be both
declared and host-dependent.

Owns: :class:`Expect`, :class:`DiagSpec` and :func:`load_spec` (every
unknown key, ill-typed value and unknown signal is a ``ConfigError`` naming
the file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headwater.diag.signals import SIGNALS
from headwater.errors import ConfigError
from headwater.hints import did_you_mean


@dataclasses.dataclass(frozen=True)
class Expect:
    signal: str
    band: tuple[float, float]
    culprit_rank: int | None = None


@dataclasses.dataclass(frozen=True)
class DiagSpec:
    path: Path
    description: str
    processes: int
    skip: int
    expect: dict[str, Expect]
    host_dependent: frozenset[str] = frozenset()


def _band(where: str, value: Any) -> tuple[float, float]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
        or value[0] > value[1]
    ):
        raise ConfigError(
            f"{where}: band must be [low, high] numbers with low <= high, got {value!r}"
        )
    return float(value[0]), float(value[1])


def _int(where: str, key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where}: `diag.{key}` must be an integer >= {low}, got {value!r}")
    return value


def _expect(w: str, e: Any, processes: int) -> Expect:
    if not isinstance(e, Mapping):
        raise ConfigError(f"{w} must be a table")
    bad = sorted(set(e) - {"signal", "band", "culprit_rank"})
    if bad:
        raise ConfigError(
            f"{w}: unknown key `{bad[0]}`{did_you_mean(bad[0], ('signal', 'band', 'culprit_rank'))} "
            "(known: signal, band, culprit_rank)"
        )
    name = e.get("signal")
    if name not in SIGNALS:
        raise ConfigError(
            f"{w}: unknown signal {name!r}{did_you_mean(str(name), SIGNALS)} "
            f"(known: {', '.join(SIGNALS)})"
        )
    culprit = e.get("culprit_rank")
    if culprit is not None:
        if SIGNALS[name].culprit_key is None:
            raise ConfigError(f"{w}: signal {name!r} has no culprit rank")
        if isinstance(culprit, bool) or not isinstance(culprit, int):
            raise ConfigError(f"{w}: culprit_rank must be an integer")
        if not 0 <= culprit < processes:
            raise ConfigError(
                f"{w}: culprit_rank {culprit} is outside 0..{processes - 1} (diag.processes)"
            )
    return Expect(name, _band(w, e.get("band")), culprit)


def load_spec(path: str | Path, **overrides: Any) -> tuple[DiagSpec, Any]:
    """The ``[diag]`` section of ``path`` and its :class:`TrainConfig`
    (with ``overrides``, dotted keys as in ``load_config``)."""
    from headwater.runconfig.config import load_config

    cfg = load_config(path, **overrides)
    where = str(path)
    raw = dict(cfg.diag)
    known = {"description", "processes", "skip", "expect", "host_dependent"}
    for k in raw:
        if k not in known:
            raise ConfigError(
                f"{where}: unknown key `diag.{k}`{did_you_mean(k, known, 'diag.')} "
                f"(known: {', '.join(sorted(known))})"
            )
    processes = _int(where, "processes", raw.get("processes", 1), 1)
    skip = _int(where, "skip", raw.get("skip", 10), 0)
    expect: dict[str, Expect] = {}
    for i, e in enumerate(raw.get("expect", [])):
        w = f"{where}: diag.expect[{i}]"
        ex = _expect(w, e, processes)
        if ex.signal in expect:
            raise ConfigError(f"{w}: signal {ex.signal!r} is declared twice")
        expect[ex.signal] = ex
    desc = raw.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(f"{where}: `diag.description` must be a string")
    host = _host_dependent(where, raw.get("host_dependent", []), expect)
    return DiagSpec(Path(path), desc, processes, skip, expect, host), cfg


def _host_dependent(where: str, value: Any, expect: Mapping[str, Expect]) -> frozenset[str]:
    """``diag.host_dependent``: known signals, none of them declared."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: `diag.host_dependent` must be a list of signal names")
    for name in value:
        if name not in SIGNALS:
            raise ConfigError(
                f"{where}: diag.host_dependent: unknown signal {name!r}{did_you_mean(name, SIGNALS)} "
                f"(known: {', '.join(SIGNALS)})"
            )
        if name in expect:
            raise ConfigError(
                f"{where}: diag.host_dependent: signal {name!r} is also declared in diag.expect"
            )
    return frozenset(value)
