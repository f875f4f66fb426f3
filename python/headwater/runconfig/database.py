"""The database a run's ``[database]`` section names: a database folder, a
mixture file, a mixture file written for a ``[[database]]`` list, or the
embedded default database (built once, cached).

Owns: :func:`resolve_database`, what the launcher opens once per run and
``headwater eval`` opens again for a run's checkpoint.

Must never: accept a folder that is not a headwater database (no
``metadata.json``) without an error naming where ``database.path`` was set.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from headwater.errors import ConfigError
from headwater.runconfig.config import TrainConfig


def resolve_database(cfg: TrainConfig) -> Path:
    """``database.path`` (a database folder or a mixture file), a mixture file
    written for the ``[[database]]`` list, or the embedded default database
    (built once, cached)."""
    from headwater.data.default_db import default_database

    if cfg.database.mixture:
        from headwater.data.default_db import cache_dir
        from headwater.mixture import write_mixture

        entries = [
            dataclasses.replace(
                e,
                path=Path(default_database(cfg.database.scale_factor, embedder=cfg.database.embedder)),
            )
            if e.path == Path("")
            else e
            for e in cfg.database.mixture
        ]
        key = hashlib.sha256(repr(entries).encode()).hexdigest()[:16]
        return write_mixture(entries, cache_dir() / "mixtures" / f"{key}.toml")
    if cfg.database.path:
        from headwater.mixture import is_mixture_file

        p = Path(cfg.database.path).expanduser()
        if is_mixture_file(p):
            return p
        if not (p / "metadata.json").is_file():
            raise ConfigError(
                f"{cfg.where('database', 'path')}: `database.path` = {cfg.database.path!r} is "
                "not a headwater database (no metadata.json); build one with "
                "`headwater preprocess`"
            )
        return p
    return Path(default_database(cfg.database.scale_factor, embedder=cfg.database.embedder))
