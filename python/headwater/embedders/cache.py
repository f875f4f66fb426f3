"""On-disk embedding cache keyed by (model name, text).

This module owns the persistent cache that makes re-runs instant: one sqlite3
database per model at ``<cache_dir>/embeddings/<model>.sqlite``, where
``cache_dir`` is ``$HEADWATER_CACHE_DIR`` when set, else
``platformdirs.user_cache_dir("headwater")``.  Rows are keyed by the SHA-256 of
the UTF-8 text (the text length is stored alongside) and hold the raw float16
vector bytes.

:class:`CachedEmbedder` wraps any embedder: it looks all texts up in bulk,
embeds only the distinct misses and writes them back in one transaction.  The
database runs in WAL mode with a busy timeout, so several processes can share
one cache directory.  Each connection is set up (WAL switch, schema) under an
exclusive ``flock`` on ``<model>.sqlite.lock``: SQLite answers two connections
that switch a fresh file to WAL at once with an immediate "database is locked"
(its deadlock avoidance skips the busy handler there), so the set-up is
serialised instead of retried.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from headwater.embedders import Embedder

__all__ = ["CACHE_DIR_ENV", "CachedEmbedder", "EmbeddingCache", "cache_dir", "text_key"]

CACHE_DIR_ENV = "HEADWATER_CACHE_DIR"

#: SQLite's historical default limit on host parameters is 999; stay below it.
MAX_PARAMS = 900
#: Seconds a connection waits on a lock held by another process.
BUSY_TIMEOUT_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    key      BLOB PRIMARY KEY,   -- sha256 of the UTF-8 text
    text_len INTEGER NOT NULL,   -- len(text) in code points
    vector   BLOB NOT NULL       -- float16 little-endian, dim values
) WITHOUT ROWID
"""


def cache_dir() -> Path:
    """Root cache folder: ``$HEADWATER_CACHE_DIR`` or the platform user cache."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("headwater"))


def text_key(text: str) -> bytes:
    """Cache key of ``text``: SHA-256 digest of its UTF-8 encoding."""
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).digest()


def _chunks(seq: Sequence[bytes], size: int) -> Iterator[Sequence[bytes]]:
    for start in range(0, len(seq), size):
        yield seq[start : start + size]


class EmbeddingCache:
    """sqlite-backed store of float16 vectors for one model."""

    def __init__(self, model: str, dim: int, root: str | Path | None = None) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", model):
            raise ValueError(f"model name {model!r} is not usable as a file name")
        self.model = model
        self.dim = dim
        base = Path(root) if root is not None else cache_dir()
        self.path = base / "embeddings" / f"{model}.sqlite"
        self.lock_path = self.path.with_name(self.path.name + ".lock")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit; transactions are explicit below.
        with closing(
            sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        ) as conn:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA synchronous = NORMAL")
            with open(self.lock_path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute(_SCHEMA)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
            yield conn

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, npt.NDArray[np.float16]]:
        """Vectors found for ``keys`` (absent keys are simply missing)."""
        found: dict[bytes, npt.NDArray[np.float16]] = {}
        if not keys:
            return found
        nbytes = self.dim * 2
        with self._connect() as conn:
            for chunk in _chunks(keys, MAX_PARAMS):
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, vector FROM embeddings WHERE key IN ({marks})", chunk
                )
                for key, blob in rows:
                    if len(blob) == nbytes:  # ignore rows from a different dim
                        found[bytes(key)] = np.frombuffer(blob, dtype="<f2")
        return found

    def put_many(self, items: Iterable[tuple[bytes, int, npt.NDArray[np.float16]]]) -> None:
        """Store ``(key, text_len, vector)`` triples in a single transaction."""
        rows = [
            (key, text_len, np.ascontiguousarray(vec, dtype="<f2").tobytes())
            for key, text_len, vec in items
        ]
        if not rows:
            return
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT OR REPLACE INTO embeddings (key, text_len, vector) VALUES (?, ?, ?)",
                    rows,
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")


class CachedEmbedder:
    """Wrap an embedder with the on-disk :class:`EmbeddingCache`.

    Same ``name``/``dim``/``embed`` as the wrapped embedder; only texts not yet
    in the cache (each distinct text once) reach ``inner.embed``.
    """

    def __init__(self, inner: Embedder, root: str | Path | None = None) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.dim: int = inner.dim
        self._root = root

    @property
    def cache(self) -> EmbeddingCache:
        # Resolved on each use so $HEADWATER_CACHE_DIR changes are honoured.
        return EmbeddingCache(self.name, self.dim, self._root)

    def embed(self, texts: list[str]) -> npt.NDArray[np.float16]:
        """Embed ``texts`` (float16 ``[len(texts), dim]``), using the cache."""
        out = np.empty((len(texts), self.dim), dtype=np.float16)
        if not texts:
            return out
        cache = self.cache
        keys = [text_key(t) for t in texts]
        unique_keys = list(dict.fromkeys(keys))
        found = cache.get_many(unique_keys)

        missing: dict[bytes, str] = {}
        for key, text in zip(keys, texts, strict=False):
            if key not in found and key not in missing:
                missing[key] = text
        if missing:
            miss_texts = list(missing.values())
            vectors = np.asarray(self.inner.embed(miss_texts), dtype=np.float16)
            if vectors.shape != (len(miss_texts), self.dim):
                raise RuntimeError(
                    f"{self.name}: embed returned shape {vectors.shape}, "
                    f"expected {(len(miss_texts), self.dim)}"
                )
            cache.put_many(
                (key, len(text), vec) for (key, text), vec in zip(missing.items(), vectors, strict=False)
            )
            found.update(zip(missing.keys(), vectors, strict=False))

        for i, key in enumerate(keys):
            out[i] = found[key]
        return out
