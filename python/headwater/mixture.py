"""Mixture files: several databases sampled as one sampler.

A mixture file is TOML with one ``[[database]]`` table per database::

    [[database]]
    path = "dbs/tpch"          # a database folder, relative to this file
    weight = 2.0               # share of batches (normalised); default 1
    tasks = ["order_status"]   # optional: only these tasks (the rest weigh 0)
    task_weights = { order_status = 3.0 }   # optional, within the database

Each batch comes from one (database, task), chosen by the database's weight,
then by its task weights. A database is named by its folder name (``#2``,
``#3`` appended to repeats), and its tasks in the mixture are
``<database>/<task>``. The trainer's config takes the same tables as its
``[[database]]`` list, where ``path = ""`` is the embedded default database
(or the database ``--db`` names). :func:`sampler_source` turns a file into the
``Sampler`` arguments (the list of paths, ``database_weights`` and
``task_weights`` keyed by mixture task name).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headwater.hints import did_you_mean, first_unknown_hint

_KEYS = {"path", "weight", "tasks", "task_weights"}


@dataclass(frozen=True)
class MixtureEntry:
    """One database of a mixture."""

    path: Path
    weight: float = 1.0
    tasks: list[str] | None = None
    task_weights: dict[str, float] = field(default_factory=dict)


def is_mixture_file(source: str | os.PathLike[str]) -> bool:
    """``source`` is a mixture file (a ``.toml`` file, not a database folder)."""
    p = Path(source)
    return p.suffix == ".toml" and p.is_file()


def parse_entries(tables: Any, base: Path, where: str) -> list[MixtureEntry]:
    """The ``[[database]]`` tables of ``where`` (paths relative to ``base``)."""
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"{where}: expected at least one [[database]] table")
    out = []
    for i, t in enumerate(tables):
        at = f"{where}: [[database]] #{i + 1}"
        if not isinstance(t, dict) or "path" not in t:
            raise ValueError(f"{at}: needs `path` (a database folder)")
        unknown = sorted(set(t) - _KEYS)
        if unknown:
            raise ValueError(
                f"{at}: unknown key(s) {unknown}{first_unknown_hint(unknown, _KEYS)}; "
                f"allowed: {sorted(_KEYS)}"
            )
        weight = t.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"{at}: `weight` must be a number >= 0, got {weight!r}")
        tasks = t.get("tasks")
        if tasks is not None and not (
            isinstance(tasks, list) and all(isinstance(x, str) for x in tasks)
        ):
            raise ValueError(f"{at}: `tasks` must be a list of task names, got {tasks!r}")
        tw = t.get("task_weights", {})
        if not isinstance(tw, dict):
            raise ValueError(f"{at}: `task_weights` must be a table {{task = weight}}")
        # "" = the trainer's default database (or its --db), resolved there.
        path = Path(t["path"]) if t["path"] == "" else base / t["path"]
        out.append(MixtureEntry(path, float(weight), tasks, dict(tw)))
    return out


def read_mixture(path: str | os.PathLike[str]) -> list[MixtureEntry]:
    """The databases of the mixture file ``path``."""
    p = Path(path)
    with p.open("rb") as f:
        doc = tomllib.load(f)
    extra = sorted(set(doc) - {"database"})
    if extra:
        raise ValueError(
            f"{p}: unknown top-level key(s) {extra}{first_unknown_hint(extra, ('database',))}; "
            "a mixture file has [[database]] tables"
        )
    return parse_entries(doc.get("database"), p.parent, str(p))


def _task_names(path: Path) -> list[str]:
    from headwater._native import Database

    meta = json.loads(Database(path).metadata_json())
    return [t["name"] for t in meta["tasks"]]


def reported_task_names(
    db: str | os.PathLike[str], top: int, listed: Sequence[str] = ()
) -> list[str]:
    """The task names with their own telemetry series when sampling ``db``
    with ``telemetry_top_databases = top`` and ``telemetry_databases =
    listed``: every task of a single database, else the tasks of the
    ``listed`` databases when any are listed, else of the ``top`` databases
    with the largest weights (ties by order), as the sampler picks them."""
    if not is_mixture_file(db):
        return _task_names(Path(db))
    entries = read_mixture(db)
    if len(entries) == 1:
        return _task_names(entries[0].path)
    names = _names(entries)
    unknown = [n for n in listed if n not in names]
    if unknown:
        raise ValueError(
            f"telemetry_databases: unknown database {unknown[0]!r}; the mixture's databases are {names}"
        )
    order = (
        [names.index(n) for n in listed]
        if listed
        else sorted(range(len(entries)), key=lambda i: (-entries[i].weight, i))[:top]
    )
    return [f"{names[i]}/{t}" for i in sorted(order) for t in _task_names(entries[i].path)]


def _names(entries: list[MixtureEntry]) -> list[str]:
    names: list[str] = []
    for e in entries:
        base = e.path.name
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return names


def sampler_args(entries: list[MixtureEntry]) -> tuple[list[str], dict[str, Any]]:
    """``Sampler`` arguments for ``entries``: the paths and the keys
    ``database_weights`` (a list) and, when any database filters or weights
    its tasks, ``task_weights`` by mixture task name."""
    paths = [str(e.path) for e in entries]
    keys: dict[str, Any] = {"database_weights": [e.weight for e in entries]}
    task_weights: dict[str, float] = {}
    single = len(entries) == 1
    for name, e in zip(_names(entries), entries, strict=True):
        if e.tasks is None and not e.task_weights:
            continue
        known = _task_names(e.path)
        for t in [*(e.tasks or []), *e.task_weights]:
            if t not in known:
                raise ValueError(
                    f"database `{name}` ({e.path}) has no task {t!r}{did_you_mean(t, known)}; "
                    f"its tasks are {known}"
                )
        for t in known:
            w = float(e.task_weights.get(t, 1.0))
            if e.tasks is not None and t not in e.tasks:
                w = 0.0
            task_weights[t if single else f"{name}/{t}"] = w
    if task_weights:
        keys["task_weights"] = task_weights
    return paths, keys


def sampler_source(source: str | os.PathLike[str]) -> tuple[str | list[str], dict[str, Any]]:
    """``(db_path, keys)`` for ``Sampler``: a database folder as it is, a
    mixture file as its paths plus the keys of :func:`sampler_args`."""
    if is_mixture_file(source):
        return sampler_args(read_mixture(source))
    return str(source), {}


def open_sampler(db: str | os.PathLike[str], **kw: Any) -> Any:
    """``Sampler`` on a database folder or a mixture file; ``kw`` are sampler
    keys (they win over the mixture file's weights)."""
    from headwater._native import Sampler

    src, keys = sampler_source(db)
    return Sampler(src, **{**keys, **kw})


def task_names(db: str | os.PathLike[str]) -> list[str]:
    """The task names a sampler on ``db`` (a folder or mixture file) has."""
    if not is_mixture_file(db):
        return _task_names(Path(db))
    entries = read_mixture(db)
    if len(entries) == 1:
        return _task_names(entries[0].path)
    return [f"{n}/{t}" for n, e in zip(_names(entries), entries, strict=True) for t in _task_names(e.path)]


def write_mixture(entries: list[MixtureEntry], path: Path) -> Path:
    """Write ``entries`` as a mixture file at ``path`` (absolute paths)."""
    out = []
    for e in entries:
        out.append("[[database]]")
        out.append(f"path = {json.dumps(str(Path(e.path).resolve()))}")
        out.append(f"weight = {float(e.weight)!r}")
        if e.tasks is not None:
            out.append(f"tasks = {json.dumps(list(e.tasks))}")
        if e.task_weights:
            inner = ", ".join(f"{json.dumps(k)} = {float(v)!r}" for k, v in e.task_weights.items())
            out.append(f"task_weights = {{ {inner} }}")
        out.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out), encoding="utf-8")
    return path
