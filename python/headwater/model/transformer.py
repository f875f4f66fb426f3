"""A small relational transformer in plain JAX (docs/training.md, "The model").

Owns: :class:`ModelConfig`, parameter init, the forward pass (value encoder →
blocks of column / feature / neighbour attention + MLP → decoder heads on the
target cell), the loss dispatch of the loss dispatch and the jitted train / eval steps. The
attention masks and the attention itself are :mod:`headwater.model.attention`; the
host → device conversion of sampler batches is :mod:`headwater.model.device`.

Plain JAX + optax, no flax: a nested dict of matrices and pure functions.

Architecture (``d = d_model``, ``D_t`` = frozen embedding width):

* **Value encoder** per cell, by semantic type (numerical 0, boolean 1,
  timestamp 2, categorical 3, text 4): numerical ``v * w + b``; timestamp
  ``[15] @ W + b``; boolean ``bool_emb[v]``; categorical
  ``unit_rms(cat_emb_table)[id] @ emb_proj[1]``; text
  ``unit_rms(text_batch_embeddings)[id] @ emb_proj[2]``. A null cell gets
  ``null_emb[stype]``, the target cell ``mask_emb[stype]`` (the target
  takes precedence over null, so neither its value nor its null bit reaches
  the input; its raw value inputs are also zeroed before any arithmetic, so
  a NaN there cannot leak through a gradient either). Added to every cell:
  ``unit_rms(col_emb_table)[column_id] @ emb_proj[0]`` and ``type_emb[stype]``.
  Frozen tables are projected first and gathered after (``[V, d]`` instead of
  ``[B, S, D_t]`` work). Padding cells are encoded like any cell and are
  never zeroed .
* **Blocks** (``num_layers``, weights stacked, ``lax.scan`` over layers): for each kind in ``attention`` a pre-norm
  (RMSNorm) residual attention sub-layer, then a pre-norm GELU MLP. Masks
  ``[B, S, S]`` are built once per forward pass from the batch: ``column``
  (same ``column_ids`` and the same packing segment, ``segment_ids``), ``feature`` (same ``seq_row_ids``), ``outbound``
  (``fk_adj[row_i, row_j]``: cell i's row references cell j's row),
  ``inbound`` (the transpose), ``neighbour`` (outbound or inbound); row pairs
  are gathered from ``fk_adj`` by ``seq_row_ids`` (no Python loops). Padding
  is excluded as key and as query; the diagonal is always allowed. Packed
  sequences need nothing more: rows are numbered per sequence and ``fk_adj``
  has no edge between segments, so feature and neighbour attention already
  stay within a segment; only column attention is masked by segment.
  Attention is QK-normalised, computed in float32 with
  ``q / max(||q||, 1e-6)`` (written as ``q * rsqrt(max(||q||², 1e-12))``,
  the same function, whose gradient is also finite at ``q = 0``), a learned
  per-head temperature, mask fill ``-1e9``, and cast back to the compute
  dtype after the weighted sum.
* **Heads** on the final-normed hidden state of each target cell
  (``target_pos [B, K]``; one per segment, ``K = 1`` unpacked, the first
  ``target_count`` slots of a sequence are real; outputs are ``[B·K]``):
  numerical (Huber on the z-score), boolean (BCE on a logit), timestamp (MSE
  on the 15-float encoding), categorical (scores against the projected
  category embeddings ``cat_emb_table[cat_emb_start + k]`` for ``k <
  max_categories``, masked to ``k < cat_emb_count``: one static window per
  target, its sequence's ``seq_cat_emb_start``/``seq_cat_emb_count``, no
  recompilation per batch; never ``[N, C, d]`` at once, :mod:`.cat_head`),
  and null (BCE: is the target null?).
* **Loss** (the loss dispatch): ``type_losses = stack([num, bool, ts, cat])``, each
  target's row of ``one_hot(seq_target_stype, 4)`` times its column (a
  batch may mix tasks and target types, ``task_mixing = "sequence"``),
  ``mean(null_loss + (1 - is_null_at_target) * type_loss)`` over the real
  targets (every segment of every sequence, weighted equally).

Numerics : parameters are float32; value inputs, frozen tables and
activations are cast to ``compute_dtype`` (bfloat16 by default) at the
encoder; norms, attention softmax and the heads' outputs run in float32.

Static shapes: ``B`` and ``S`` are fixed by the sampler config, but ``U``
(distinct texts of a batch) and ``R`` (most rows of a sequence) vary per
batch. :func:`headwater.model.device.batch_to_device` pads both up to
``bucket_size`` (a multiple of 64 up to 1024, then 8 buckets per doubling) so ``jit`` compiles
once per bucket, not once per batch; padded text rows and ``fk_adj`` rows are
zeros that no cell indexes.

Speed (``ModelConfig``): ``attention_impl`` (dense reference or fused
``dot_product_attention``), one-hot reads of tables up to ``onehot_max_rows``
rows, ``remat`` policy; ``grad_accum`` micro-batches (:mod:`.accum`).
Not used: ``col_perm`` / ``out_perm`` / ``in_perm`` (for a block-sparse
kernel) and ``task_idx`` (logging only).

Must never: read a target cell's value or null bit into the input; zero
padding hidden states; build masks with per-cell Python loops.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from headwater import _native
from headwater.model.accum import accumulated_grads
from headwater.model.attention import ATTENTION_IMPLS, ATTENTION_KINDS, _attention, attention_masks
from headwater.model.cat_head import CAT_CHUNK_MIB, CAT_HEAD_IMPLS, categorical_logits
from headwater.model.cat_head import max_categories as max_categories
from headwater.model.optim import OptConfig, make_optimizer
from headwater.model.scale import REMAT_POLICIES, remat
from headwater.model.targets import _at_target, per_target, target_positions, target_weights

#: Semantic type codes of ``semantic_types`` (``src/batch/mod.rs``).
NUMERICAL, BOOLEAN, TIMESTAMP, CATEGORICAL, TEXT = range(5)
NUM_STYPES = 5
#: ``target_stype`` takes one of the first four codes.
NUM_TARGET_STYPES = 4
TIMESTAMP_DIM = 15

#: The 20 batch tensors of the batch layout (docs/sampling.md), defined once in Rust.
BATCH_KEYS: tuple[str, ...] = tuple(_native.BATCH_KEYS)
#: The packing tensors the model also reads (rows of the same Rust list):
#: each cell's segment, each segment's target position and the segments
#: per sequence. Unpacked batches carry them too (one segment each).
SEGMENT_KEYS: tuple[str, ...] = tuple(
    t["name"]
    for t in _native.batch_tensors()
    if t["name"] in ("segment_ids", "target_pos", "target_count")
)
#: The per-sequence forms of the per-batch target tensors the model reads
#: (each sequence's target type and categorical window: a batch may mix
#: tasks, ``task_mixing = "sequence"``) and the masked-cell targets
#: (``mask_prob_max``; :mod:`headwater.model.targets`).
TARGET_KEYS: tuple[str, ...] = tuple(
    t["name"]
    for t in _native.batch_tensors()
    if t["name"]
    in (
        "seq_target_stype",
        "seq_cat_emb_start",
        "seq_cat_emb_count",
        "mask_pos",
        "mask_count",
        "mask_cat_start",
        "mask_cat_count",
    )
)
#: Every tensor the model reads, in the native list's order.
MODEL_KEYS: tuple[str, ...] = BATCH_KEYS + SEGMENT_KEYS + TARGET_KEYS

#: Default of ``ModelConfig.onehot_max_rows``: the type, null, mask and bool
#: tables (5 and 2 rows), the column table and small category tables are
#: one-hot matmuls; text tables (a bucket of at least 64 rows, usually
#: hundreds) and large category tables stay gathers.
ONEHOT_MAX_ROWS = 256

Params = dict[str, Any]
Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
StepFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Model shape and numerics. A bigger model is a change here only."""

    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4
    #: Attention sub-layers of every block, in order (see ``ATTENTION_KINDS``).
    attention: tuple[str, ...] = ("column", "feature", "neighbour")
    #: Static size of the categorical head's window (the most categories of
    #: any categorical target column; see :func:`max_categories`).
    max_categories: int = 64
    compute_dtype: str = "bfloat16"
    #: Initial per-head temperature of QK-normalised attention.
    qk_scale_init: float = 8.0
    huber_delta: float = 1.0
    norm_eps: float = 1e-6
    #: Rematerialisation of each layer in the backward pass (``jax.checkpoint``
    #: over the layer scan): ``none``, ``full`` (recompute everything: least
    #: memory, most time) or ``dots_saveable`` (keep matmul outputs).
    remat: str = "none"
    #: ``dense`` (masked float32 einsum, the reference) or ``fused``
    #: (``jax.nn.dot_product_attention``: cuDNN on a GPU, XLA elsewhere).
    attention_impl: str = "dense"
    #: Tables of at most this many rows are read by one-hot matmuls instead of
    #: gathers (a gather's backward is a scatter-add with heavy index
    #: collisions on small tables); 0 = gathers everywhere (the reference).
    onehot_max_rows: int = ONEHOT_MAX_ROWS
    #: The categorical head scores its targets in chunks of at most this many
    #: MiB of float32 windows ``[chunk, max_categories, d_model]`` (or table
    #: scores ``[chunk, V]``); 0 = all targets at once.
    cat_chunk_mib: int = CAT_CHUNK_MIB
    #: How the categorical head scores a target's window: ``gather`` its
    #: ``max_categories`` rows of the category table, ``matmul`` all ``V``
    #: rows then take the window, or ``auto`` (``matmul`` when ``V <=
    #: max_categories · d_model / 8``).
    cat_head_impl: str = "auto"

    def __post_init__(self) -> None:
        if self.d_model <= 0 or self.num_layers < 0 or self.num_heads <= 0:
            raise ValueError("d_model and num_heads must be > 0, num_layers >= 0")
        if self.d_model % self.num_heads:
            ok = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide d_model ({self.d_model}): "
                f"one of {', '.join(map(str, ok))}"
            )
        bad = [k for k in self.attention if k not in ATTENTION_KINDS]
        if bad:
            raise ValueError(f"attention: unknown kinds {bad}, expected some of {ATTENTION_KINDS}")
        if not self.attention:
            raise ValueError("attention: at least one kind is needed")
        if self.compute_dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"compute_dtype: {self.compute_dtype!r} is not a float dtype")
        choices = {
            "remat": REMAT_POLICIES,
            "attention_impl": ATTENTION_IMPLS,
            "cat_head_impl": CAT_HEAD_IMPLS,
        }
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(
                    f"{key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}"
                )
        for key, least in (("max_categories", 1), ("onehot_max_rows", 0), ("cat_chunk_mib", 0)):
            if getattr(self, key) < least:
                raise ValueError(f"{key} must be >= {least}, got {getattr(self, key)}")

    @property
    def dtype(self) -> jnp.dtype:
        return jnp.dtype(self.compute_dtype)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


# ----------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------


def _host_rng(key: jax.Array | int) -> np.random.Generator:
    if isinstance(key, int):
        return np.random.default_rng(key)
    data = (
        np.asarray(
            jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
        )
        .astype(np.uint64)
        .ravel()
    )
    return np.random.default_rng(np.random.SeedSequence(data.tolist()))


def init_params(key: jax.Array | int, cfg: ModelConfig, embed_dim: int) -> Params:
    """Float32 parameters for frozen tables of width ``embed_dim`` (``D_t``).

    ``key`` is a JAX PRNG key (new-style or raw ``uint32[2]``) or an int. The
    values are drawn on the host by a NumPy generator seeded from the key's
    data: the same key gives bit-identical parameters on every backend, and
    no per-shape ``jax.random`` kernels are compiled (seconds on a CPU).

    Block weights are stacked over layers ``L`` and attention kinds ``A``
    (``wqkv [L, A, 3, d, d]``, ``wo [L, A, d, d]``, ``w_up [L, d, f]``, …) so
    the forward pass scans over layers and Muon orthogonalises each matrix
    slice in one batched call. ``enc.emb_proj [3, D_t, d]`` projects the
    column (0), categorical (1) and text (2) embeddings.
    """
    d, f, h = cfg.d_model, cfg.d_model * cfg.mlp_ratio, cfg.num_heads
    n_layers, n_kinds = cfg.num_layers, len(cfg.attention)
    rng = _host_rng(key)

    def normal(shape: tuple[int, ...], std: float) -> jax.Array:
        return jnp.asarray(std * rng.standard_normal(shape, np.float32))

    def lin(shape: tuple[int, ...]) -> jax.Array:
        return normal(shape, 1.0 / math.sqrt(shape[-2]))

    def full(shape: tuple[int, ...], value: float) -> jax.Array:
        return jnp.asarray(np.full(shape, value, np.float32))

    enc = {
        "numeric_w": normal((1, d), 1.0),
        "numeric_b": full((d,), 0.0),
        "timestamp_w": lin((TIMESTAMP_DIM, d)),
        "timestamp_b": full((d,), 0.0),
        "bool_emb": normal((2, d), 1.0),
        "emb_proj": lin((3, embed_dim, d)),
        "null_emb": normal((NUM_STYPES, d), 1.0),
        "mask_emb": normal((NUM_STYPES, d), 1.0),
        "type_emb": normal((NUM_STYPES, d), 1.0),
    }
    blocks = {
        "attn_norm": full((n_layers, n_kinds, d), 1.0),
        "wqkv": lin((n_layers, n_kinds, 3, d, d)),
        "wo": lin((n_layers, n_kinds, d, d)),
        "qk_scale": full((n_layers, n_kinds, h), cfg.qk_scale_init),
        "mlp_norm": full((n_layers, d), 1.0),
        "w_up": lin((n_layers, d, f)),
        "w_down": lin((n_layers, f, d)),
    }
    head = {
        "norm": full((d,), 1.0),
        "numeric_w": lin((d, 1)),
        "numeric_b": full((1,), 0.0),
        "bool_w": lin((d, 1)),
        "bool_b": full((1,), 0.0),
        "timestamp_w": lin((d, TIMESTAMP_DIM)),
        "timestamp_b": full((TIMESTAMP_DIM,), 0.0),
        "cat_w": lin((d, d)),
        "null_w": lin((d, 1)),
        "null_b": full((1,), 0.0),
    }
    return {"enc": enc, "blocks": blocks, "head": head}


# ----------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype: jnp.dtype) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale).astype(dtype)


def _unit_rms(table: jax.Array) -> jax.Array:
    """Rows scaled to unit RMS (float32), so any embedder's scale looks alike."""
    t = table.astype(jnp.float32)
    ms = jnp.mean(t * t, axis=-1, keepdims=True)
    return t * lax.rsqrt(jnp.maximum(ms, 1e-12))


def _project_table(table: jax.Array, w: jax.Array, dtype: jnp.dtype) -> jax.Array:
    return _unit_rms(table).astype(dtype) @ w.astype(dtype)


def _take(table: jax.Array, ids: jax.Array, onehot_max_rows: int = 0) -> jax.Array:
    """``table[ids]`` (ids clipped to the table). A table of at most
    ``onehot_max_rows`` rows is read as ``one_hot(ids) @ table``: the same
    values (one product per output), and a backward that is a matmul, not a
    scatter-add."""
    n = table.shape[0]
    ids = jnp.clip(ids.astype(jnp.int32), 0, n - 1)
    if n <= onehot_max_rows:
        return jax.nn.one_hot(ids, n, dtype=table.dtype) @ table
    return jnp.take(table, ids, axis=0, mode="clip")


def _block(blk: Params, h: jax.Array, masks: jax.Array, cfg: ModelConfig) -> jax.Array:
    """One layer; ``blk`` is that layer's slice of the stacked block params and
    ``masks [A, B, S, S]`` the attention masks in ``cfg.attention`` order. The
    attention sub-layers run as a scan over kinds (compiled once)."""
    dt = cfg.dtype

    def sub_layer(h: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, None]:
        norm, wqkv, wo, qk_scale, mask = xs
        x = rms_norm(h, norm, cfg.norm_eps, dt)
        o = _attention(wqkv, wo, qk_scale, x, mask, cfg.num_heads, dt, cfg.attention_impl)
        return h + o, None

    xs = (blk["attn_norm"], blk["wqkv"], blk["wo"], blk["qk_scale"], masks)
    h, _ = lax.scan(sub_layer, h, xs)
    x = rms_norm(h, blk["mlp_norm"], cfg.norm_eps, dt)
    return h + jax.nn.gelu(x @ blk["w_up"].astype(dt)) @ blk["w_down"].astype(dt)


# ----------------------------------------------------------------------------
# Forward pass
# ----------------------------------------------------------------------------


def encode(
    enc: Params,
    batch: Mapping[str, jax.Array],
    col_emb: jax.Array,
    cat_table: jax.Array,
    cfg: ModelConfig,
) -> jax.Array:
    """Cell embeddings ``[B, S, d]`` in the compute dtype.

    ``cat_table`` is the projected categorical table ``[Vc, d]``
    (``unit_rms(cat_emb) @ emb_proj[1]``, shared with the categorical head).
    """
    dt = cfg.dtype
    st = jnp.clip(batch["semantic_types"].astype(jnp.int32), 0, NUM_STYPES - 1)
    is_target = batch["is_target"] != 0
    is_null = batch["is_null"] != 0
    hide = is_target | is_null | (batch["is_padding"] != 0)
    # Inputs of hidden cells are zeroed before any arithmetic.
    num = jnp.where(hide, 0.0, batch["numeric_values"]).astype(dt)
    ts = jnp.where(hide[..., None], 0.0, batch["timestamp_values"]).astype(dt)
    bools = jnp.where(hide, 0, jnp.clip(batch["bool_values"].astype(jnp.int32), 0, 1))
    cat_ids = jnp.where(hide, 0, batch["categorical_embed_ids"].astype(jnp.int32))
    text_ids = jnp.where(hide, 0, batch["text_embed_ids"].astype(jnp.int32))

    text_table = _project_table(batch["text_batch_embeddings"], enc["emb_proj"][2], dt)
    oh = cfg.onehot_max_rows
    values = [
        num[..., None] * enc["numeric_w"][0].astype(dt) + enc["numeric_b"].astype(dt),
        _take(enc["bool_emb"].astype(dt), bools, oh),
        ts @ enc["timestamp_w"].astype(dt) + enc["timestamp_b"].astype(dt),
        _take(cat_table, cat_ids, oh),
        _take(text_table, text_ids, oh),
    ]
    # Each cell's own type: a select chain (elementwise forward and backward).
    value = values[0]
    for k in range(1, NUM_STYPES):
        value = jnp.where((st == k)[..., None], values[k], value)
    null_e = _take(enc["null_emb"].astype(dt), st, oh)
    mask_e = _take(enc["mask_emb"].astype(dt), st, oh)
    h = jnp.where(is_target[..., None], mask_e, jnp.where(is_null[..., None], null_e, value))
    col_table = _project_table(col_emb, enc["emb_proj"][0], dt)
    col_e = _take(col_table, batch["column_ids"], oh)
    return h + col_e + _take(enc["type_emb"].astype(dt), st, oh)


def hidden_states(
    params: Params,
    batch: Mapping[str, jax.Array],
    col_emb: jax.Array,
    cat_emb: jax.Array,
    cfg: ModelConfig,
) -> jax.Array:
    """Hidden states ``[B, S, d]`` of every cell after the last block."""
    cat_table = _project_table(cat_emb, params["enc"]["emb_proj"][1], cfg.dtype)
    return _hidden(params, batch, col_emb, cat_table, cfg)


def _hidden(
    params: Params,
    batch: Mapping[str, jax.Array],
    col_emb: jax.Array,
    cat_table: jax.Array,
    cfg: ModelConfig,
) -> jax.Array:
    h = encode(params["enc"], batch, col_emb, cat_table, cfg)
    by_kind = attention_masks(batch, cfg.attention)
    masks = jnp.stack([by_kind[k] for k in cfg.attention])  # [A, B, S, S]

    def layer(h: jax.Array, blk: Params) -> tuple[jax.Array, None]:
        return _block(blk, h, masks, cfg), None

    if cfg.num_layers:
        h, _ = lax.scan(remat(layer, cfg.remat), h, params["blocks"])
    return h


def forward(
    params: Params,
    batch: Mapping[str, jax.Array],
    col_emb: jax.Array,
    cat_emb: jax.Array,
    cfg: ModelConfig,
) -> dict[str, jax.Array]:
    """Decoder outputs (float32) at each target cell, ``N = B·(K+M)`` of
    them (sequence-major: each sequence's ``K`` segment targets, ``K = 1``
    unpacked, then its ``M`` masked-cell slots, ``M = 0`` by default;
    :mod:`headwater.model.targets`).

    ``numeric [N]``, ``boolean [N]`` (logit), ``timestamp [N, 15]``,
    ``categorical [N, max_categories]`` (logits, invalid slots ``-1e9``),
    ``null [N]`` (logit). Slots past ``target_count`` are computed and
    must be ignored (:func:`target_weights`).
    """
    cat_table = _project_table(cat_emb, params["enc"]["emb_proj"][1], cfg.dtype)
    h = _hidden(params, batch, col_emb, cat_table, cfg)
    hp = params["head"]
    z = rms_norm(_at_target(h, target_positions(batch)), hp["norm"], cfg.norm_eps, jnp.float32)

    # Each target's own categorical window (its sequence's target column,
    # a masked cell's own column), in chunks: never [N, C, d] (:mod:`.cat_head`).
    start, count = per_target(batch, "cat_emb_start"), per_target(batch, "cat_emb_count")
    q = z @ hp["cat_w"]
    cat_logits = categorical_logits(
        q, cat_table, start, count, cfg.max_categories, cfg.cat_chunk_mib, cfg.cat_head_impl
    )
    return {
        "numeric": (z @ hp["numeric_w"] + hp["numeric_b"])[:, 0],
        "boolean": (z @ hp["bool_w"] + hp["bool_b"])[:, 0],
        "timestamp": z @ hp["timestamp_w"] + hp["timestamp_b"],
        "categorical": cat_logits,
        "null": (z @ hp["null_w"] + hp["null_b"])[:, 0],
    }


# ----------------------------------------------------------------------------
# Loss (the loss dispatch (docs/training.md))
# ----------------------------------------------------------------------------


def compute_loss(
    outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array], cfg: ModelConfig
) -> tuple[jax.Array, Metrics]:
    """The the loss dispatch loss and per-part means over the real targets (every segment)."""
    pos = target_positions(batch)
    y_null = _at_target(batch["is_null"], pos).astype(jnp.float32)
    y_num = _at_target(batch["numeric_values"], pos).astype(jnp.float32)
    y_bool = _at_target(batch["bool_values"], pos).astype(jnp.float32)
    y_ts = _at_target(batch["timestamp_values"], pos).astype(jnp.float32)
    cat_id = _at_target(batch["categorical_embed_ids"], pos).astype(jnp.int32)
    y_cat = jnp.clip(cat_id - per_target(batch, "cat_emb_start"), 0, cfg.max_categories - 1)
    # A null target's value slots may hold anything: keep them finite, its
    # type loss is multiplied by 0 below.
    y_num = jnp.where(y_null > 0, 0.0, y_num)
    y_ts = jnp.where(y_null[:, None] > 0, 0.0, y_ts)

    num_loss = optax.huber_loss(outputs["numeric"], y_num, delta=cfg.huber_delta)
    bool_loss = optax.sigmoid_binary_cross_entropy(outputs["boolean"], y_bool)
    ts_loss = jnp.mean(jnp.square(outputs["timestamp"] - y_ts), axis=-1)
    cat_loss = optax.softmax_cross_entropy_with_integer_labels(outputs["categorical"], y_cat)
    null_loss = optax.sigmoid_binary_cross_entropy(outputs["null"], y_null)

    type_losses = jnp.stack([num_loss, bool_loss, ts_loss, cat_loss])  # [4, N]
    # Each target's own type (its sequence's task): one-hot [N, 4].
    selector = jax.nn.one_hot(per_target(batch, "target_stype"), NUM_TARGET_STYPES)
    type_loss = jnp.sum(selector.T * type_losses, axis=0)  # [N]
    per_example = null_loss + (1.0 - y_null) * type_loss
    w = target_weights(batch)
    n = jnp.maximum(jnp.sum(w), 1.0)
    loss = jnp.sum(w * per_example) / n
    non_null = jnp.maximum(jnp.sum(w * (1.0 - y_null)), 1.0)
    metrics = {
        "loss": loss,
        "null_loss": jnp.sum(w * null_loss) / n,
        "type_loss": jnp.sum(w * (1.0 - y_null) * type_loss) / non_null,
    }
    return loss, metrics


def loss_fn(
    params: Params,
    batch: Mapping[str, jax.Array],
    col_emb: jax.Array,
    cat_emb: jax.Array,
    cfg: ModelConfig,
) -> tuple[jax.Array, Metrics]:
    return compute_loss(forward(params, batch, col_emb, cat_emb, cfg), batch, cfg)


# ----------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------


def init_opt_state(params: Params, opt_cfg: OptConfig) -> Any:
    return make_optimizer(opt_cfg).init(params)


@functools.cache
def make_train_step(
    model_cfg: ModelConfig,
    opt_cfg: OptConfig,
    axis_name: str | None = None,
    *,
    donate: bool = False,
    grad_accum: int = 1,
) -> StepFn:
    """A jitted ``(params, opt_state, batch, col_emb, cat_emb) -> (params, opt_state, metrics)``.

    With ``axis_name``, gradients, loss and metrics are averaged with
    ``lax.pmean`` over that axis (call it under ``shard_map``/``pmap``/
    ``vmap`` binding the name); clipping and the update then see the mean.
    ``donate`` donates ``params`` and ``opt_state`` buffers to the update.
    ``grad_accum`` micro-batches per step, one update (:mod:`.accum`).
    Cached per argument set (configs are frozen): one compiled step per shape.
    """
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    tx = make_optimizer(opt_cfg)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(
        params: Params, opt_state: Any, batch: Batch, col_emb: jax.Array, cat_emb: jax.Array
    ) -> tuple[Params, Any, Metrics]:
        grads, metrics = accumulated_grads(
            lambda p, b: grad_fn(p, b, col_emb, cat_emb, model_cfg),
            target_weights,
            params,
            batch,
            grad_accum,
        )
        if axis_name is not None:
            grads = lax.pmean(grads, axis_name)
            metrics = lax.pmean(metrics, axis_name)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        return params, opt_state, metrics

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


@functools.cache
def make_eval_step(model_cfg: ModelConfig, axis_name: str | None = None) -> StepFn:
    """A jitted ``(params, batch, col_emb, cat_emb) -> metrics`` (no update)."""

    def step(params: Params, batch: Batch, col_emb: jax.Array, cat_emb: jax.Array) -> Metrics:
        _, metrics = loss_fn(params, batch, col_emb, cat_emb, model_cfg)
        if axis_name is not None:
            metrics = lax.pmean(metrics, axis_name)
        return metrics

    return jax.jit(step)
