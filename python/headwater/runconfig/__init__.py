"""A run's configuration: the ``headwater train`` TOML file (or mapping),
its ``--set`` and flag overrides, checked key by key, with where each
value came from.

Rooms: :mod:`.config` (:class:`~.config.TrainConfig`, one frozen
dataclass per section, :func:`~.config.load_config`), :mod:`.origins`
(``file:line``, the flag or ``--set`` behind each key,
:func:`~.origins.parse_overrides`), :mod:`.sampler_config` (the
trainer's ``[sampler]`` defaults, ``[sampler]`` and ``[ranks.N]`` layered
and handed to the sampler's own validation) and :mod:`.database` (the
database ``[database]`` names: a folder, a mixture, or the default one,
built once and cached).

Read by the run (:mod:`headwater.train`), ``headwater eval``
(:mod:`headwater.evaluation`), ``headwater diag`` and ``headwater bench``. Must never: import any of them
(``tests/python/test_layout.py`` fails on it). Importing this package does
not import JAX.
"""

from __future__ import annotations

from headwater.runconfig.config import TrainConfig, load_config
from headwater.runconfig.database import resolve_database
from headwater.runconfig.origins import parse_overrides

__all__ = ["TrainConfig", "load_config", "parse_overrides", "resolve_database"]
