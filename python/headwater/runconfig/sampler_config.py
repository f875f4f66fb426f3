"""The ``[sampler]`` and ``[ranks.N]`` tables of a ``headwater train`` config.

The sampler's keys, defaults and ranges are defined once, by ``SamplerConfig``
in Rust; these tables go straight to its validation
(``headwater._native.validate_sampler_config``) and the only thing added here
is *where* a rejected value came from (file and line, flag, ``--set`` or
default) and hints for the keys the launcher sets.

Owns: :data:`TRAINER_DEFAULTS` (the trainer's own choice of ``[sampler]``
values for the main job: a small ``B`` and ``S`` so a CPU step stays under a
second; validated like a user's table), :data:`LAUNCHER_KEYS`,
:func:`check_table`, :func:`stream_keys` and :func:`explain` (a sampler
error, prefixed with the value's origin). The key a sampler error is about
is its ``ConfigError.key``; only an error raised by Python code without one
is searched for a key it names (:func:`named_key`).

``[ranks.N]`` may not set a key that defines the batch stream (the keys a
saved sampler state records: ``stream`` in the sampler's schema): the ranks
read one global stream (one pool per task and split, the same task picked at
every step, rank ``r`` taking its slice), so a per-rank value would make the
ranks disagree about it and repeat or skip seeds.

Must never: keep its own copy of a sampler key's default, range or of the
list of stream keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from headwater.errors import ConfigError
from headwater.hints import first_unknown_hint
from headwater.runconfig.origins import FLAGS, Origins

#: The trainer's ``[sampler]`` defaults (not the sampler's: the main job's
#: small batches, so the default run finishes in minutes on 2 CPU cores).
TRAINER_DEFAULTS: dict[str, Any] = {
    "default_batch_size": 8,
    "default_sequence_length": 256,
    "num_threads": 1,
    "num_prefetch": 4,
}

#: Sampler keywords a config may not set in ``[sampler]``, and why.
LAUNCHER_KEYS: dict[str, str] = {
    "rank": "set by the launcher: use --num-processes",
    "world_size": "set by the launcher: use --num-processes",
    "local_rank": "set by the launcher: use --num-processes",
    "prometheus_port": "set it under [logging]",
    "prometheus_host": "set it under [logging]",
    "otlp_endpoint": "set it under [logging]",
}

#: Sampler keywords the trainer fills from ``[logging]``.
LOGGING_KEYS = ("prometheus_port", "prometheus_host", "otlp_endpoint")


def error_key(error: BaseException | str, candidates: Iterable[str]) -> tuple[str | None, str]:
    """The key ``error`` is about and what it says about it: a sampler
    ``ConfigError``'s ``key`` and ``what`` (the message after the key); for
    an error without them (raised by Python code, or a bare message) the
    first of ``candidates`` its message names and the whole message."""
    key, what = getattr(error, "key", None), getattr(error, "what", None)
    if isinstance(key, str) and isinstance(what, str):
        return key, what
    return named_key(str(error), candidates), str(error)


def named_key(message: str, candidates: Iterable[str]) -> str | None:
    """The candidate key ``message`` names first (whole words only)."""
    best: tuple[int, int, str] | None = None
    for key in candidates:
        m = re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message)
        if m and (best is None or (m.start(), -len(key)) < best[:2]):
            best = (m.start(), -len(key), key)
    return best[2] if best else None


def _reject_launcher_keys(table: Mapping[str, Any], section: str, origins: Origins) -> None:
    for key in table:
        if key in LAUNCHER_KEYS:
            raise ConfigError(
                f"{origins.of(f'{section}.{key}')}: `{section}.{key}` cannot be set here "
                f"({LAUNCHER_KEYS[key]})"
            )


def stream_keys() -> frozenset[str]:
    """The sampler keys that define the batch stream (``StreamConfig`` in Rust,
    read from ``sampler_config_schema()``)."""
    from headwater import _native

    return frozenset(f["name"] for f in _native.sampler_config_schema() if f["stream"])


def _reject_stream_keys(table: Mapping[str, Any], section: str, origins: Origins) -> None:
    rank = section.removeprefix("ranks.")
    for key in sorted(stream_keys() & set(table)):
        dotted = f"{section}.{key}"
        raise ConfigError(
            f"{origins.of(dotted)}: `{dotted}` cannot be set for rank {rank} alone: "
            f"`{key}` defines the batch stream, which every rank shares (one global seed "
            f"pool per task and split; each step all ranks pick the same task and take "
            f"their slice of its order), so a per-rank value would repeat or skip seeds; "
            f"set it under [sampler] for all ranks"
        )


def _reject_dotted_task_names(table: Mapping[str, Any], section: str, origins: Origins) -> None:
    """A ``task_weights`` entry whose value is a table: TOML read an unquoted
    task name with a dot (``orders.status = 1``) as a nested table; say to
    quote it."""
    tw = table.get("task_weights")
    if not isinstance(tw, Mapping):
        return
    for name, value in tw.items():
        parts = [str(name)]
        while isinstance(value, Mapping) and value:
            inner, value = next(iter(value.items()))
            parts.append(str(inner))
        if len(parts) > 1:
            dotted, key = ".".join(parts), f"{section}.task_weights"
            raise ConfigError(
                f"{origins.of(key)}: `{key}`: TOML reads the unquoted task name `{dotted}` as "
                f'nested tables; quote a name that holds a dot: "{dotted}" = ... in the file, '
                f"--set '{key}={{\"{dotted}\"=...}}' on the command line"
            )


def check_table(
    layers: Sequence[tuple[str, Mapping[str, Any]]],
    origins: Origins,
    task_names: list[str] | None = None,
) -> None:
    """Validate the merge of ``layers`` (``(section, table)``, later wins) with
    the sampler's own validation; an error names the layer that set the key."""
    for section, table in layers:
        if section != "default":
            _reject_launcher_keys(table, section, origins)
        if section.startswith("ranks."):
            _reject_stream_keys(table, section, origins)
        _reject_dotted_task_names(table, section, origins)
    from headwater import _native

    merged: dict[str, Any] = {}
    for _, table in layers:
        merged.update(table)
    try:
        _native.validate_sampler_config(merged, task_names)
    except ValueError as e:
        # Every bad key at once (the core checks the config whole), each
        # under the layer, file and line that set it.
        errors: list[BaseException] = list(getattr(e, "errors", None) or [e])
        lines = [explain(x, layers, origins) + _hint(x, merged, task_names) for x in errors]
        if len(lines) == 1:
            err = ConfigError(lines[0])
        else:
            err = ConfigError(f"{len(lines)} bad sampler keys:\n  " + "\n  ".join(lines))
        first = errors[0]
        if isinstance(first, ConfigError) and first.key in merged:
            section = next(s for s, t in reversed(layers) if first.key in t)
            err.key, err.value, err.what = f"{section}.{first.key}", first.value, first.what
        raise err from None


def _hint(error: BaseException, merged: Mapping[str, Any], task_names: list[str] | None) -> str:
    """The did-you-mean of an unknown task in ``task_weights``; else empty."""
    if getattr(error, "key", None) != "task_weights" or not task_names:
        return ""
    tw = merged.get("task_weights")
    unknown = [n for n in tw if n not in task_names] if isinstance(tw, Mapping) else []
    return first_unknown_hint(unknown, task_names)


def explain(
    error: BaseException | str,
    layers: Sequence[tuple[str, Mapping[str, Any]]],
    origins: Origins,
) -> str:
    """A sampler error prefixed with the origin of its key (the last layer
    that set it), naming the key once."""
    keys = {k for _, t in layers for k in t}
    key, what = error_key(error, keys)
    if key is None or key not in keys:
        return f"{origins.source}: [sampler] {error}"
    section = next(s for s, t in reversed(layers) if key in t)
    dotted = f"{section}.{key}"
    if section == "default":
        return f"default: `sampler.{key}` (the trainer's default): {what}"
    return f"{origins.of(dotted)}: `{dotted}`: {what}"


def explain_logging(
    error: BaseException | str, origins: Origins, rank: int, port: int | None
) -> str | None:
    """A sampler error about a key the trainer set from ``[logging]``, under
    that key and its flag; None if it is about none of them."""
    key, what = error_key(error, LOGGING_KEYS)
    if key not in LOGGING_KEYS:
        return None
    dotted = f"logging.{key}"
    flag = FLAGS.get(dotted)
    extra = f" (flag {flag})" if flag else ""
    if key == "prometheus_port" and port:
        extra += f"; rank {rank} serves port {port} + {rank} = {port + rank}"
    hint = ""
    if key == "prometheus_port" and "in use" in what:
        hint = (
            " (another process, perhaps another run on this node, serves that port: "
            "`--prometheus-port auto` picks free ports, 0 serves none)"
        )
    return f"{origins.of(dotted)}: `{dotted}`{extra}: {what}{hint}"
