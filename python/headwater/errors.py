"""The headwater exception hierarchy.

``HeadwaterError`` is the base of every headwater failure; ``FormatError`` (a
database file is truncated, corrupt or of an unsupported version),
``SchemaError`` (the relational input cannot become a database),
``ConfigError`` (unknown or invalid configuration) and ``StateError`` (a saved
sampler state from another snapshot, config or version) derive from it. Invalid
arguments raise ``ValueError`` and missing files ``FileNotFoundError``.
"""

from headwater._native import ConfigError, FormatError, HeadwaterError, SchemaError, StateError

__all__ = ["ConfigError", "FormatError", "HeadwaterError", "SchemaError", "StateError"]
