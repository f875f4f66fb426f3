"""The "hash" embedder: deterministic, offline feature-hashing vectors.

This module owns only the Python face of the embedder; the hashing itself is
implemented in Rust and exposed as ``headwater._native.hash_embed(texts, dim)``
(float16 ``[N, dim]``, L2-normalised rows).  The native module is imported
lazily inside :meth:`HashEmbedder.embed`, so importing this module (and
``headwater.embedders``) works without the compiled extension.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["HashEmbedder"]


class HashEmbedder:
    """Feature-hashing text embedder backed by ``headwater._native.hash_embed``."""

    name: str = "hash"

    def __init__(self, dim: int = 384) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim: int = dim

    def embed(self, texts: list[str]) -> npt.NDArray[np.float16]:
        """Embed ``texts`` into float16 ``[len(texts), dim]`` L2-normalised rows."""
        from headwater._native import hash_embed

        out = np.asarray(hash_embed(list(texts), self.dim))
        if out.dtype != np.float16:
            out = out.astype(np.float16)
        if out.shape != (len(texts), self.dim):
            raise RuntimeError(
                f"hash_embed returned shape {out.shape}, expected {(len(texts), self.dim)}"
            )
        return out
