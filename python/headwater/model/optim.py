"""The optimiser of the relational transformer (docs/training.md).

Owns: :class:`OptConfig`, the learning-rate schedules (linear warmup, then
cosine decay to ``final_lr_fraction`` of the peak) and :func:`make_optimizer`,
the ``optax`` chain ``clip_by_global_norm → optax.contrib.muon``.

Which parameters get Muon. ``optax.contrib.muon`` (checked against optax
0.2.8) already sends every parameter whose ``ndim != 2`` to its inner AdamW,
but by default it gives Muon *every* 2-D array — that would orthogonalise
embedding tables (``bool_emb [2, d]``, ``null_emb [5, d]``) and the decoder
output layers (``numeric_w [d, 1]``), which Muon is not meant for. So the
partition is explicit: :func:`muon_dimension_numbers` marks as Muon only the
hidden weight matrices named in :data:`MUON_WEIGHTS` — attention Q/K/V/O, the
MLP, and the encoder's ``emb_proj`` that maps frozen ``D_t``-dimensional
embeddings to ``d_model`` — and everything else (embeddings, norm scales,
biases, attention temperatures, decoder heads) uses AdamW. Those matrices are
stored stacked (``wqkv [L, A, 3, d, d]``: layers × attention kinds × Q/K/V),
so their dimension numbers name the last two axes as (reduction, output) and
the leading ones as batch axes: Muon orthogonalises every ``[d, d]`` slice on
its own, in one batched Newton–Schulz per leaf (few leaves = short compile).
It is passed as ``muon_weight_dimension_numbers``; :func:`param_labels`
gives the same split as ``"muon"``/``"adam"`` labels for inspection and tests.

Invariants: the schedule and the partition depend only on the config and the
parameter tree's paths and shapes, never on values, so every rank builds the
same optimiser. Must never: hold state outside the returned optax state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax
from optax.contrib import MuonDimensionNumbers

#: Parameter names (leaf keys) that Muon optimises; matrices in the last two axes.
MUON_WEIGHTS = frozenset({"emb_proj", "wqkv", "wo", "w_up", "w_down"})
#: Weights are used as ``x @ W`` with ``W [..., in, out]``.
MATRIX_DIMS = MuonDimensionNumbers(reduction_axis=-2, output_axis=-1)


@dataclasses.dataclass(frozen=True)
class OptConfig:
    """Optimiser hyperparameters.

    ``learning_rate`` is Muon's peak rate, ``adam_learning_rate`` AdamW's;
    both follow the same schedule shape: linear warmup from 0 over
    ``warmup_steps``, then cosine decay until ``total_steps`` to
    ``final_lr_fraction`` of the peak (and constant after). Gradients are
    clipped to global norm ``clip_norm`` (after the cross-rank mean) before
    either optimiser sees them.
    """

    learning_rate: float = 0.02
    adam_learning_rate: float = 3e-3
    warmup_steps: int = 100
    total_steps: int = 10_000
    final_lr_fraction: float = 0.1
    clip_norm: float = 1.0
    muon_beta: float = 0.95
    weight_decay: float = 0.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"total_steps ({self.total_steps}) must exceed warmup_steps ({self.warmup_steps})"
            )
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise ValueError(f"final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
        if self.learning_rate <= 0 or self.adam_learning_rate <= 0:
            raise ValueError("learning_rate and adam_learning_rate must be > 0")
        if self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")


def make_schedule(cfg: OptConfig, peak: float | None = None) -> optax.Schedule:
    """Linear warmup to ``peak`` (default ``cfg.learning_rate``), cosine decay to 10 %."""
    peak_value = cfg.learning_rate if peak is None else peak
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak_value,
        warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.total_steps,
        end_value=peak_value * cfg.final_lr_fraction,
    )


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _is_muon(path: tuple[Any, ...], leaf: Any) -> bool:
    return bool(path) and getattr(leaf, "ndim", 0) >= 2 and _key_name(path[-1]) in MUON_WEIGHTS


def param_labels(params: Any) -> Any:
    """``"muon"`` or ``"adam"`` per leaf of ``params`` (see the module doc)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: "muon" if _is_muon(path, x) else "adam", params
    )


def muon_dimension_numbers(params: Any) -> Any:
    """:data:`MATRIX_DIMS` for Muon leaves, ``None`` for AdamW leaves."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: MATRIX_DIMS if _is_muon(path, x) else None, params
    )


def make_optimizer(cfg: OptConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm`` then Muon (hidden matrices) / AdamW (the rest)."""
    muon: Callable[..., optax.GradientTransformation] = optax.contrib.muon
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        muon(
            learning_rate=make_schedule(cfg),
            beta=cfg.muon_beta,
            weight_decay=cfg.weight_decay,
            adam_b1=cfg.adam_b1,
            adam_b2=cfg.adam_b2,
            adam_weight_decay=cfg.adam_weight_decay,
            adam_learning_rate=make_schedule(cfg, cfg.adam_learning_rate),
            muon_weight_dimension_numbers=muon_dimension_numbers,
        ),
    )
