"""The headwater exception hierarchy.

``HeadwaterError`` is the base of every headwater failure:

* ``ConfigError`` (also a ``ValueError``): an unknown sampler key, or a value
  outside its range; the message names the key, the value and the range,
  and the exception carries them: ``key``, ``value`` (the offending value
  as given; None for an unknown key or a setting that fails as a whole) and
  ``what`` (the message after the key), so nobody parses the message;
* ``FormatError``: a database file is truncated, corrupt or of an
  unsupported version;
* ``SchemaError``: the relational input cannot become a database;
* ``WorkerError``: a sampler producer thread failed or panicked;
* ``ResourceError``: a resource limit such as ``max_rss_bytes`` was hit;
* ``SamplerShutdown``: the sampler was shut down; no more batches;
* ``StateError``: a saved sampler state from another snapshot, config or
  state version; the message names the field, and the exception carries it
  as ``field`` (with ``what``: the saved and the current value).

Other invalid arguments raise ``ValueError`` and missing files
``FileNotFoundError``.
"""

from headwater._native import (
    ConfigError,
    FormatError,
    HeadwaterError,
    ResourceError,
    SamplerShutdown,
    SchemaError,
    StateError,
    WorkerError,
)

__all__ = [
    "ConfigError",
    "FormatError",
    "HeadwaterError",
    "ResourceError",
    "SamplerShutdown",
    "SchemaError",
    "StateError",
    "WorkerError",
]
