"""The ``headwater train`` configuration: a TOML file, checked key by key.

Owns: :class:`TrainConfig` (one frozen dataclass per section), loading a
TOML file or a dict with every unknown key and every ill-typed value
reported as a :class:`~headwater.errors.ConfigError` naming the dotted key
and where its value came from (``file:line``, the flag or ``--set``, or
``default``: :mod:`.origins`). The ``[sampler]`` and ``[ranks.N]`` tables go
to the sampler's own validation (:mod:`.sampler_config`).

Sections (every key optional; see ``diag_configs/healthy.toml`` for a
complete file)::

    [database]  path, scale_factor, embedder
    [sampler]   any Sampler keyword except the ones the launcher sets
                (rank, world_size, local_rank, prometheus_*, otlp_endpoint);
                task_weights is a table {task name = weight} (unlisted
                tasks keep weight 1)
    [ranks.N]   per-rank overrides of [sampler] keys outside the batch
                stream (threads, prefetch, debug_*: diagnostics); a stream
                key (split_ratios, seed, pool_fraction, ...) is refused
    [model]     ModelConfig fields (max_categories = 0: from the database)
    [optim]     OptConfig fields (total_steps = 0: train.steps)
    [train]     steps, val_every, val_batches, eval_every, eval_max_seeds, eval_final,
                seed, log_every, checkpoint_every, keep_checkpoints, ...
    [logging]   wandb_mode, wandb_project, run_name, dir, prometheus_port,
                otlp_endpoint
    [diag]      read by ``headwater diag`` only (expectations of the run)

Must never: accept a key it does not know, or let a bad value reach the
training loop without the key's name in the error.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headwater.cluster.watchdog import timeout_problem
from headwater.errors import ConfigError
from headwater.hints import did_you_mean
from headwater.runconfig import sampler_config as SC
from headwater.runconfig.origins import Origins, locate_keys, parse_overrides


@dataclasses.dataclass(frozen=True)
class DatabaseSection:
    #: A preprocessed database directory; "" = the embedded default database.
    path: str = ""
    #: TPC-H scale factor of the default database (when ``path`` is "").
    scale_factor: float = 0.01
    embedder: str = "auto"
    #: ``[[database]]`` tables: a mixture (see :mod:`headwater.mixture`);
    #: ``path`` is then unused.
    mixture: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.scale_factor <= 0:
            raise ValueError(f"scale_factor must be > 0, got {self.scale_factor}")


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int = 300
    #: Validate every this many steps (0 = only at the end).
    val_every: int = 100
    #: Batches per rank in each validation.
    val_batches: int = 4
    #: Run a capped evaluation pass over val every this many steps (0 = off):
    #: per-task metrics on the first ``eval_max_seeds`` seeds of each task
    #: (the last step's too, unless ``eval_final`` evaluates it in full).
    eval_every: int = 0
    #: Seeds per task in the periodic evaluation (the split's fixed order).
    eval_max_seeds: int = 256
    #: At the end of the run, evaluate val and test (``headwater eval``
    #: scores any saved checkpoint later, on whole splits).
    eval_final: bool = True
    #: Seeds per task in those final passes (the split's fixed order; 0 =
    #: every seed of the split). A pass costs one forward per seed: on the
    #: default database whole val + test splits are ~12.4 K sequences, five
    #: times the 2.4 K the default 300 steps train on.
    eval_final_max_seeds: int = 256
    #: Seed of parameter init (the sampler has its own ``[sampler] seed``).
    seed: int = 0
    #: Progress lines every this many steps when stdout is not a terminal.
    log_every: int = 25
    #: Log step ``t``'s telemetry one step late so the step never waits for
    #: its collective (see ``StepHook``).
    buffered_telemetry: bool = False
    #: Print the step-time breakdown at the end (``--profile``).
    profile: bool = False
    #: Steps left out of throughput and timing figures (compilation).
    warmup_steps: int = 3
    #: Save a checkpoint (params, optimiser state, sampler state, step, W&B
    #: run id; :mod:`headwater.rundir.checkpoint`) every this many steps, at
    #: the end, and on SIGTERM/SIGINT (0 = only at the end and on a signal).
    checkpoint_every: int = 100
    #: Checkpoints kept under ``<run>/checkpoints/`` (the oldest go first).
    keep_checkpoints: int = 2
    #: Training batches a background thread fetches ahead of the step and
    #: copies to the device while it computes (:mod:`headwater.train.prefetch`);
    #: 0 = off (the loop fetches each batch itself right after dispatching a step).
    device_prefetch: int = 2
    #: Micro-batches per step (docs/training.md): the batch is split into this many,
    #: their gradients averaged, one optimiser update. Must divide the batch.
    grad_accum: int = 1
    #: Multi-process jobs: a rank whose heartbeat stops for this many
    #: seconds (killed, crashed, hung) is declared lost by the others, which
    #: name it and the step and exit (:mod:`headwater.cluster.watchdog`); 2 to 86400.
    peer_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ValueError(f"steps must be > 0, got {self.steps}")
        for name in (
            "val_every",
            "val_batches",
            "eval_every",
            "log_every",
            "warmup_steps",
            "checkpoint_every",
            "eval_final_max_seeds",
            "device_prefetch",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.log_every == 0:
            raise ValueError("log_every must be >= 1")
        if self.eval_max_seeds < 1:
            raise ValueError(f"eval_max_seeds must be >= 1, got {self.eval_max_seeds}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        problem = timeout_problem(self.peer_timeout_s)
        if problem is not None:
            raise ValueError(problem)


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    #: "offline" (default: written under ``dir``, sync later with
    #: ``wandb sync``), "online" or "disabled".
    wandb_mode: str = "offline"
    wandb_project: str = "headwater"
    #: Run name ("" = ``train-<time>``).
    run_name: str = ""
    #: Where runs are written (W&B files, per-rank summaries, logs).
    dir: str = "runs"
    #: Prometheus exporter base port (rank r serves ``port + r`` on
    #: 127.0.0.1); 0 = no exporter; "auto" = each rank takes a free port
    #: (printed, and listed in the run's ``prometheus_targets.json``).
    prometheus_port: int | str = 9464
    prometheus_host: str = "127.0.0.1"
    #: OTLP/HTTP endpoint for the sampler's stage spans ("" = off).
    otlp_endpoint: str = ""
    #: Keep the exporters up this long after the last step, so that a
    #: scraper sees the final values of a short run.
    prometheus_linger_s: float = 0.0
    #: Rank 0 writes ``metrics.jsonl``: per step, the reduced telemetry
    #: (without bucket counts) and the trainer's metrics (``headwater diag``
    #: reads it).
    jsonl: bool = True
    #: Every rank writes ``drains-rank<r>.jsonl``: its own drained values per
    #: step (without bucket counts), to check the reduction against.
    record_drains: bool = False

    def __post_init__(self) -> None:
        if self.wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(
                f"wandb_mode must be offline, online or disabled, got {self.wandb_mode!r}"
            )
        if not 0 <= self.prometheus_linger_s <= 3600:
            raise ValueError(
                f"prometheus_linger_s must be in 0..=3600, got {self.prometheus_linger_s}"
            )
        if isinstance(self.prometheus_port, str):
            if self.prometheus_port != "auto":
                raise ValueError(
                    f'prometheus_port must be a port, 0 or "auto", got {self.prometheus_port!r}'
                )
        elif not 0 <= self.prometheus_port <= 65535:
            raise ValueError(f"prometheus_port must be in 0..=65535, got {self.prometheus_port}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    database: DatabaseSection
    sampler: Mapping[str, Any]
    ranks: Mapping[int, Mapping[str, Any]]
    model: Any  # headwater.model.transformer.ModelConfig (imported lazily: it pulls in JAX)
    optim: Any  # headwater.model.optim.OptConfig
    train: TrainSection
    logging: LoggingSection
    diag: Mapping[str, Any]
    source: str = "<defaults>"
    #: ``model.max_categories`` was 0: take it from the database.
    auto_categories: bool = True
    origins: Origins = dataclasses.field(default_factory=lambda: Origins("<defaults>"))

    def where(self, section: str, key: str) -> str:
        """Where ``section.key`` was set (``file:line``, flag, ``default``)."""
        return self.origins.of(f"{section}.{key}")

    def sampler_layers(self, rank: int) -> list[tuple[str, Mapping[str, Any]]]:
        """The trainer's defaults, ``[sampler]``, ``[ranks.<rank>]`` (later wins)."""
        layers: list[tuple[str, Mapping[str, Any]]] = [
            ("default", SC.TRAINER_DEFAULTS),
            ("sampler", self.sampler),
        ]
        if rank in self.ranks:
            layers.append((f"ranks.{rank}", self.ranks[rank]))
        return layers

    def sampler_kwargs(self, rank: int) -> dict[str, Any]:
        """The ``Sampler`` config of ``rank`` (``task_weights`` a ``{task:
        weight}`` mapping, as the sampler takes it)."""
        kw: dict[str, Any] = {}
        for _, table in self.sampler_layers(rank):
            kw.update(table)
        if "split_ratios" in kw:
            kw["split_ratios"] = tuple(kw["split_ratios"])
        return kw

    def check_tasks(self, db: Path) -> None:
        """Check every rank's sampler table against the database's task names
        (the sampler's own validation, with the names)."""
        names = task_names(db)
        for rank in sorted({0, *self.ranks}):
            SC.check_table(self.sampler_layers(rank), self.origins, names)

    def explain_sampler_error(self, e: Exception, rank: int) -> str:
        """A sampler's rejection of this config, under the key that caused it."""
        base = self.logging.prometheus_port
        port = base if isinstance(base, int) else None
        # The exception itself, not its text: its `key` and `what` name the
        # key once (the text repeats it as "config `key`: ...").
        msg = SC.explain_logging(e, self.origins, rank, port)
        return msg or SC.explain(e, self.sampler_layers(rank), self.origins)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for the W&B run config and the run's summary)."""
        return {
            "database": {
                **dataclasses.asdict(self.database),
                # [[database]] entries as plain data (paths as strings).
                "mixture": [
                    {**dataclasses.asdict(e), "path": str(e.path)} for e in self.database.mixture
                ],
            },
            "sampler": dict(self.sampler),
            "ranks": {str(k): dict(v) for k, v in self.ranks.items()},
            "model": dataclasses.asdict(self.model),
            "optim": dataclasses.asdict(self.optim),
            "train": dataclasses.asdict(self.train),
            "logging": dataclasses.asdict(self.logging),
            "source": self.source,
        }


def task_names(db: Path) -> list[str]:
    """The database's (or mixture file's) task names, in order."""
    from headwater.mixture import task_names as names

    return names(db)


_SECTIONS = ("database", "sampler", "ranks", "model", "optim", "train", "logging", "diag")


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        t, getattr(t, "__name__", str(t))
    )


def _check_value(where: str, key: str, value: Any, t: Any) -> Any:
    """``value`` as type ``t`` (ints widen to floats, lists to tuples), or a ConfigError."""
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if str in args and isinstance(value, str):
            return value
        t, origin = args[0], typing.get_origin(args[0])
    if origin is tuple or t is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
            raise ConfigError(f"{where}: `{key}` must be a list of strings, got {value!r}")
        return tuple(value)
    if t is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: `{key}` must be a number, got {value!r}")
        return float(value)
    if t is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: `{key}` must be an integer, got {value!r}")
    if t in (bool, str) and not isinstance(value, t):
        raise ConfigError(f"{where}: `{key}` must be {_type_name(t)}, got {value!r}")
    return value


def _dataclass_section(cls: Any, table: Mapping[str, Any], origins: Origins, section: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    for key, value in table.items():
        where = origins.of(f"{section}.{key}")
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown key `{section}.{key}`{did_you_mean(key, fields, f'{section}.')} "
                f"(known: {', '.join(sorted(fields))})"
            )
        kw[key] = _check_value(where, f"{section}.{key}", value, hints[key])
    try:
        return cls(**kw)
    except ValueError as e:
        named = SC.named_key(str(e), fields)
        at = origins.of(f"{section}.{named}") if named else origins.source
        err = ConfigError(f"{at}: [{section}] {e}")
        if named:  # the key, the value as given and the message after the key
            err.key, err.what = f"{section}.{named}", str(e)
            err.value = json.dumps(table[named]) if named in table else None
        raise err from None


def _read(source: str | Path | Mapping[str, Any] | None) -> tuple[dict[str, Any], Origins]:
    if source is None:
        return {}, Origins("<defaults>")
    if isinstance(source, Mapping):
        raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in source.items()}
        return raw, Origins("<dict>")
    path = Path(source)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text ({e})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: invalid TOML: {e}") from None
    return raw, Origins(where, locate_keys(text))


def _check_sections(raw: Mapping[str, Any], origins: Origins) -> None:
    for key, value in raw.items():
        if key not in _SECTIONS:
            raise ConfigError(
                f"{origins.of(key)}: unknown section or key `{key}`{did_you_mean(key, _SECTIONS)} "
                f"(known sections: {', '.join(_SECTIONS)})"
            )
        if key == "database" and isinstance(value, list):
            continue  # [[database]]: a mixture, checked by load_config
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{origins.of(key)}: `{key}` must be a table ([{key}]), got {value!r}"
            )


def _ranks(raw: Mapping[str, Any], origins: Origins) -> dict[int, dict[str, Any]]:
    ranks: dict[int, dict[str, Any]] = {}
    for rk, table in raw.get("ranks", {}).items():
        where = origins.of(f"ranks.{rk}")
        try:
            r = int(rk)
            if r < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{where}: `ranks.{rk}`: a rank must be an integer >= 0") from None
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: `ranks.{rk}` must be a table")
        ranks[r] = dict(table)
    return ranks


def _model_and_optim(
    raw: Mapping[str, Any], train: TrainSection, origins: Origins
) -> tuple[Any, Any, bool]:
    from headwater.model.optim import OptConfig
    from headwater.model.transformer import ModelConfig

    model_tbl = _apply_preset(dict(raw.get("model", {})), origins)
    # max_categories = 0 (the default): the trainer reads it from the database.
    auto_categories = model_tbl.get("max_categories", 0) == 0
    if auto_categories:
        model_tbl["max_categories"] = 1
    optim_tbl = dict(raw.get("optim", {}))
    optim_tbl.setdefault("total_steps", 0)
    optim_tbl.setdefault("warmup_steps", min(100, max(1, train.steps // 10)))
    if optim_tbl["total_steps"] == 0:
        optim_tbl["total_steps"] = max(train.steps, optim_tbl["warmup_steps"] + 1)
    model = _dataclass_section(ModelConfig, model_tbl, origins, "model")
    optim = _dataclass_section(OptConfig, optim_tbl, origins, "optim")
    return model, optim, auto_categories


def _apply_preset(model_tbl: dict[str, Any], origins: Origins) -> dict[str, Any]:
    """``[model]`` with its ``preset`` expanded (the keys set beside it win)."""
    from headwater.model.scale import PRESETS, preset

    name = model_tbl.pop("preset", "default")
    where = origins.of("model.preset")
    if not isinstance(name, str):
        raise ConfigError(f"{where}: `model.preset` must be a string, got {name!r}")
    try:
        return {**preset(name), **model_tbl}
    except ValueError:
        raise ConfigError(
            f"{where}: `model.preset` must be one of {', '.join(PRESETS)}, got {name!r}"
        ) from None


def _check_grad_accum(train: TrainSection, sampler_layers: list[Any], origins: Origins) -> None:
    """``train.grad_accum`` divides every rank's batch size."""
    from headwater import _native

    for rank, layers in sampler_layers:
        kw = {k: v for _, t in layers for k, v in t.items()}
        # Every step's B, by the core's rule (the layers passed check_table).
        shapes = _native.step_shapes(kw)
        batch = shapes["eval"]["B"]
        if batch % train.grad_accum:
            raise ConfigError(
                f"{origins.of('train.grad_accum')}: `train.grad_accum` ({train.grad_accum}) "
                f"must divide the batch size (`sampler.default_batch_size` = {batch} on "
                f"rank {rank}): one of "
                f"{', '.join(str(g) for g in range(1, batch + 1) if batch % g == 0)}"
            )
        if not kw.get("sequence_lengths"):
            continue
        for shape in shapes["train"]:
            if shape["B"] % train.grad_accum:
                raise ConfigError(
                    f"{origins.of('train.grad_accum')}: `train.grad_accum` "
                    f"({train.grad_accum}) must divide every step's batch size: "
                    f"`sampler.tokens_per_batch` = {kw['tokens_per_batch']} / S = {shape['S']} "
                    f"is B = {shape['B']} on rank {rank}"
                )


def _database_section(raw: Any, origins: Origins) -> DatabaseSection:
    """``[database]``, or a ``[[database]]`` list (a mixture, paths relative
    to the config file)."""
    if not isinstance(raw, list):
        return _dataclass_section(DatabaseSection, raw, origins, "database")
    from headwater.mixture import parse_entries

    src = Path(origins.source)
    base = src.parent if src.is_file() else Path.cwd()
    try:
        entries = parse_entries(raw, base, origins.of("database"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return DatabaseSection(mixture=tuple(entries))


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, **overrides: Any
) -> TrainConfig:
    """A :class:`TrainConfig` from a TOML file, a dict or nothing (defaults).

    ``overrides``: dotted keys (``{"train.steps": 5}``) applied on top, as the
    CLI flags and ``--set`` do.
    """
    raw, origins = _read(source)
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if section == "database" and isinstance(raw.get("database"), list):
            # A mixture: --db (database.path) stands in for its `path = ""`
            # entries (the default database); other database keys do not apply.
            if key != "path":
                raise ConfigError(f"`database.{key}` cannot be set for a [[database]] mixture")
            for t in raw["database"]:
                if isinstance(t, dict) and t.get("path") == "" and value:
                    t["path"] = str(Path(value).resolve())
            continue
        if section == "ranks" and "." in key:
            # `ranks.N.KEY`: rank N's table (`ranks.N` alone replaces it).
            rk, _, key = key.partition(".")
            table = raw.setdefault("ranks", {}).setdefault(rk, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{origins.of(f'ranks.{rk}')}: `ranks.{rk}` must be a table")
            table[key] = value
        else:
            raw.setdefault(section, {})[key] = value
        origins.override(dotted, value)
    _check_sections(raw, origins)
    ranks = _ranks(raw, origins)
    sampler = dict(raw.get("sampler", {}))
    rank_layers = []
    for rank in sorted({0, *ranks}):
        layers = [("default", SC.TRAINER_DEFAULTS), ("sampler", sampler)]
        if rank in ranks:
            layers.append((f"ranks.{rank}", ranks[rank]))
        SC.check_table(layers, origins)
        rank_layers.append((rank, layers))
    train = _dataclass_section(TrainSection, raw.get("train", {}), origins, "train")
    _check_grad_accum(train, rank_layers, origins)
    model, optim, auto_categories = _model_and_optim(raw, train, origins)
    return TrainConfig(
        database=_database_section(raw.get("database", {}), origins),
        sampler=sampler,
        ranks=ranks,
        model=model,
        optim=optim,
        train=train,
        logging=_dataclass_section(LoggingSection, raw.get("logging", {}), origins, "logging"),
        diag=dict(raw.get("diag", {})),
        source=origins.source,
        auto_categories=auto_categories,
        origins=origins,
    )


__all__ = ["TrainConfig", "load_config", "parse_overrides", "task_names"]
