"""Sampler batches → device arrays with static shapes.

Owns: :func:`bucket_size` (the static size ``U`` and ``R`` are padded to, so
``jit`` compiles once per bucket instead of once per batch), :func:`pad_batch`
(NumPy padding of the tensors the model reads), :func:`batch_to_device` and
:func:`tables_to_device` (the frozen embedding tables).

Must never: change a value a cell indexes (padded text rows and ``fk_adj``
rows are zeros no cell points at), or keep keys outside ``MODEL_KEYS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from headwater.model.transformer import MODEL_KEYS, Batch


def bucket_size(n: int, base: int = 64) -> int:
    """``n`` rounded up to a static bucket: a multiple of ``base`` up to
    ``16 * base``, then a multiple of 1/8 of the enclosing power of two
    (8 buckets per doubling, at most 12.5 % waste). Never below ``base``."""
    n = max(int(n), 1)
    if n <= 16 * base:
        return -(-n // base) * base
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


def pad_batch(
    np_batch: Mapping[str, np.ndarray],
    *,
    bucket: int = 64,
    text_rows: int | None = None,
    fk_rows: int | None = None,
    max_categories: int | None = None,
) -> dict[str, np.ndarray]:
    """The tensors the model reads (``MODEL_KEYS``) with ``U`` and ``R`` padded to static sizes (NumPy).

    ``fingerprint`` (and any other extra key) is dropped; dtypes are kept.
    ``text_rows`` / ``fk_rows`` force a size (at least the batch's own);
    otherwise :func:`bucket_size` picks it. With ``max_categories``, a batch
    whose ``cat_emb_count`` (of any sequence) exceeds it is a ``ValueError``.
    """
    missing = [k for k in MODEL_KEYS if k not in np_batch]
    if missing:
        raise KeyError(f"batch is missing keys {missing}")
    out = {k: np.asarray(np_batch[k]) for k in MODEL_KEYS}
    text = out["text_batch_embeddings"]
    u = text.shape[0]
    u_to = bucket_size(u, bucket) if text_rows is None else text_rows
    if u_to < u:
        raise ValueError(f"text_rows={u_to} is below the batch's {u} distinct texts")
    if u_to > u:
        out["text_batch_embeddings"] = np.concatenate(
            [text, np.zeros((u_to - u, text.shape[1]), text.dtype)]
        )
    adj = out["fk_adj"]
    r = adj.shape[1]
    r_to = bucket_size(r, bucket) if fk_rows is None else fk_rows
    if r_to < r:
        raise ValueError(f"fk_rows={r_to} is below the batch's {r} rows")
    if r_to > r:
        out["fk_adj"] = np.pad(adj, ((0, 0), (0, r_to - r), (0, r_to - r)))
    most = int(np.max(out["seq_cat_emb_count"], initial=int(out["cat_emb_count"][0])))
    if max_categories is not None and most > max_categories:
        raise ValueError(f"cat_emb_count={most} exceeds max_categories={max_categories}")
    return out


def batch_to_device(
    np_batch: Mapping[str, np.ndarray],
    device: Any = None,
    **pad_kw: Any,
) -> Batch:
    """:func:`pad_batch`, then ``jax.device_put`` (``device`` or the default)."""
    arrays = jax.device_put(pad_batch(np_batch, **pad_kw), device)
    return {k: arrays[k] for k in MODEL_KEYS}


def tables_to_device(
    col_emb: np.ndarray, cat_emb: np.ndarray, device: Any = None
) -> tuple[jax.Array, jax.Array]:
    """The frozen f16 tables on device, each padded to at least one row
    (a database without categorical columns has ``Vc = 0``)."""

    def at_least_one(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, np.float16)
        return t if t.shape[0] > 0 else np.zeros((1, t.shape[1]), np.float16)

    col, cat = jax.device_put((at_least_one(col_emb), at_least_one(cat_emb)), device)
    return col, cat
