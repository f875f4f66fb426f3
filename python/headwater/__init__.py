"""headwater: an observability-first sampler for relational transformers.

The Rust core lives in ``headwater._native``; this package re-exports it and
adds the Python side (preprocessing front end, embedders, CLI).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Names resolved lazily so pure-Python modules (embedders, schema parsing)
# import without the compiled extension, e.g. while it is being built.
_LAZY = {
    "preprocess": ("headwater.preprocessing", "preprocess"),
    "inspect": ("headwater.inspection", "inspect"),
    "default_database": ("headwater.data.default_db", "default_database"),
    "Database": ("headwater._native", "Database"),
    "Sampler": ("headwater._native", "Sampler"),
    "BATCH_KEYS": ("headwater._native", "BATCH_KEYS"),
    "HeadwaterError": ("headwater.errors", "HeadwaterError"),
    "ConfigError": ("headwater.errors", "ConfigError"),
    "FormatError": ("headwater.errors", "FormatError"),
    "SchemaError": ("headwater.errors", "SchemaError"),
    "WorkerError": ("headwater.errors", "WorkerError"),
    "ResourceError": ("headwater.errors", "ResourceError"),
    "SamplerShutdown": ("headwater.errors", "SamplerShutdown"),
    "StateError": ("headwater.errors", "StateError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headwater' has no attribute {name!r}")


__all__ = [
    "BATCH_KEYS",
    "ConfigError",
    "Database",
    "FormatError",
    "HeadwaterError",
    "ResourceError",
    "Sampler",
    "SamplerShutdown",
    "SchemaError",
    "StateError",
    "WorkerError",
    "default_database",
    "inspect",
    "preprocess",
]
