"""The headwater exception hierarchy.

``HeadwaterError`` is the base of every headwater failure; ``FormatError`` (a
database file is truncated, corrupt or of an unsupported version),
``SchemaError`` (the relational input cannot become a database) and
``ConfigError`` (unknown or invalid configuration) derive from it. Invalid
arguments raise ``ValueError`` and missing files ``FileNotFoundError``.
"""

from headwater._native import ConfigError, FormatError, HeadwaterError, SchemaError

__all__ = ["ConfigError", "FormatError", "HeadwaterError", "SchemaError"]
