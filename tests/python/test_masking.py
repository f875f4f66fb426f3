"""Masked cells as extra targets (``mask_prob_max``).

Sampler side: nothing changes by default; the masked share follows ``p ~
U[0, mask_prob_max]``; masked cells are marked (``is_masked``,
``is_target``, ``mask_pos``) with their column's categorical window; the
same at 1 and 2 threads; the per-sequence count in telemetry. Model side:
a masked cell's value never reaches the hidden states, and the loss over a
batch with masked cells equals a NumPy computation of the loss dispatch over every
target, each with its own type and window.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SmallData, build_small_db, tiny_model

import headwater
from headwater import _native

N: Any = _native
B, S = 16, 48


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Path:
    return build_small_db(tmp_path_factory.mktemp("masking"), small_data).path


def _batches(db: Path, n: int, **kw: Any) -> list[dict[str, np.ndarray]]:
    cfg: dict[str, Any] = {
        "default_batch_size": B,
        "default_sequence_length": S,
        "num_threads": 1,
        "task_pick": "round_robin",
        "telemetry": False,
        **kw,
    }
    s = N.Sampler(db, **cfg)
    try:
        return [s.next_train_batch() for _ in range(n)]
    finally:
        s.shutdown()


def _eligible(b: dict[str, np.ndarray]) -> np.ndarray:
    """Cells masking may pick, before masking: real, non-null, decodable
    type, not the seed's target."""
    seed_target = (b["is_target"] != 0) & (b["is_masked"] == 0)
    return (
        (b["semantic_types"] >= 0)
        & (b["semantic_types"] <= 3)
        & (b["is_padding"] == 0)
        & (b["is_null"] == 0)
        & ~seed_target
    )


def test_no_masking_by_default(db: Path) -> None:
    for b in _batches(db, 3):
        assert not b["is_masked"].any() and not b["mask_count"].any()
        assert b["mask_pos"].shape == (B, 0) and b["mask_cat_start"].shape == (B, 0)
        assert (b["is_target"].sum(axis=1) == 1).all(), "only the seed's target"


def test_masked_share_follows_p_and_cells_are_marked(db: Path) -> None:
    pmax = 0.6
    m = int(np.ceil(pmax * S))
    got = _batches(db, 12, mask_prob_max=pmax)
    masked = eligible = 0
    shares = []
    for b in got:
        assert b["mask_pos"].shape == (B, m)
        el = _eligible(b)
        mk = b["is_masked"] != 0
        assert not (mk & ~el).any(), "only eligible cells are masked"
        assert (b["is_target"][mk] == 1).all(), "a masked cell is a target"
        for q in range(B):
            n = int(b["mask_count"][q])
            pos = np.flatnonzero(mk[q])
            assert n == len(pos) <= m
            np.testing.assert_array_equal(b["mask_pos"][q][:n], pos)
            assert not b["mask_pos"][q][n:].any()
            for j, p in enumerate(pos):
                if b["semantic_types"][q, p] == 3:
                    start, count = b["mask_cat_start"][q, j], b["mask_cat_count"][q, j]
                    assert count > 0
                    assert start <= b["categorical_embed_ids"][q, p] < start + count
            if el[q].sum() >= 8:
                shares.append(n / el[q].sum())
        masked += int(mk.sum())
        eligible += int(el.sum())
    # p ~ U[0, 0.6] per sequence: the mean share is about 0.3, and shares
    # spread over [0, 0.6] (not one p for all).
    assert 0.22 < masked / eligible < 0.38, masked / eligible
    assert min(shares) < 0.15 and max(shares) > 0.45, (min(shares), max(shares))


def test_masking_is_the_same_at_any_thread_count(db: Path) -> None:
    one = _batches(db, 4, mask_prob_max=0.5, num_threads=1)
    two = _batches(db, 4, mask_prob_max=0.5, num_threads=2)
    for a, b in zip(one, two, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # The unmasked tensors are today's batch: masking only marks targets.
    plain = _batches(db, 4)
    for a, b in zip(one, plain, strict=True):
        for k in ("semantic_types", "numeric_values", "categorical_embed_ids", "seq_row_ids"):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_masked_cells_in_telemetry(db: Path) -> None:
    for pmax in (0.0, 0.8):
        s = N.Sampler(db, default_batch_size=B, default_sequence_length=S, mask_prob_max=pmax)
        try:
            got = [s.next_train_batch() for _ in range(3)]
            m = s.drain_step_metrics()
        finally:
            s.shutdown()
        total = sum(int(b["mask_count"].sum()) for b in got)
        assert (total > 0) == (pmax > 0)
        assert (m["sampler/context/masked_cells_max"] > 0) == (pmax > 0), m


def test_mask_prob_max_out_of_range_names_the_key(db: Path) -> None:
    for bad in (-0.1, 1.5):
        with pytest.raises(headwater.ConfigError) as e:
            _batches(db, 1, mask_prob_max=bad)
        assert e.value.key == "mask_prob_max"


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(db: Path) -> Any:
    pytest.importorskip("jax")

    from headwater.model import transformer as M

    cfg, params, col, cat = tiny_model(
        N.Sampler(db, default_batch_size=2, default_sequence_length=S), 2
    )
    return M, cfg, params, col, cat


def test_a_masked_cells_value_never_reaches_the_model(db: Path, model: Any) -> None:
    import jax.numpy as jnp

    M, cfg, params, col, cat = model
    b = _batches(db, 1, mask_prob_max=0.8)[0]
    mk = b["is_masked"] != 0
    assert mk.any()
    other = {**b, "numeric_values": np.where(mk, 123.0, b["numeric_values"]).astype(np.float32)}
    other["bool_values"] = np.where(mk, 1 - b["bool_values"], b["bool_values"]).astype(np.uint8)
    other["is_null"] = np.where(mk, 1, b["is_null"]).astype(np.uint8)

    def hidden(x: dict[str, np.ndarray]) -> np.ndarray:
        dev = {k: jnp.asarray(x[k]) for k in M.MODEL_KEYS}
        return np.asarray(M.hidden_states(params, dev, col, cat, cfg))

    np.testing.assert_array_equal(hidden(b), hidden(other))


def _np_loss(out: dict[str, np.ndarray], b: dict[str, np.ndarray], cfg: Any) -> float:
    """the loss dispatch by hand over every real target: the seed's (its sequence's type
    and window) and each masked cell's (its own type and column window)."""
    total, n, i = 0.0, 0, 0
    for q in range(B):
        slots = [(int(b["target_pos"][q, 0]), int(b["seq_target_stype"][q]),
                  int(b["seq_cat_emb_start"][q]), True)]
        m = b["mask_pos"].shape[1]
        for j in range(m):
            p = int(b["mask_pos"][q, j])
            slots.append((p, int(b["semantic_types"][q, p]), int(b["mask_cat_start"][q, j]),
                          j < int(b["mask_count"][q])))
        for p, t, start, real in slots:
            if real:
                null = float(b["is_null"][q, p])
                logit = out["null"][i]
                loss = np.logaddexp(0, logit) - null * logit
                if not null:
                    if t == 0:
                        d = abs(out["numeric"][i] - b["numeric_values"][q, p])
                        h = cfg.huber_delta
                        loss += 0.5 * d * d if d <= h else h * (d - 0.5 * h)
                    elif t == 1:
                        y, z = float(b["bool_values"][q, p]), out["boolean"][i]
                        loss += np.logaddexp(0, z) - y * z
                    elif t == 2:
                        loss += np.mean((out["timestamp"][i] - b["timestamp_values"][q, p]) ** 2)
                    else:
                        y = int(b["categorical_embed_ids"][q, p]) - start
                        z = out["categorical"][i].astype(np.float64)
                        loss += np.log(np.exp(z - z.max()).sum()) + z.max() - z[y]
                total += loss
                n += 1
            i += 1
    return total / n


def test_loss_covers_masked_cells_each_with_its_own_type(db: Path, model: Any) -> None:
    import jax.numpy as jnp

    M, cfg, params, col, cat = model
    b = next(
        x
        for x in _batches(db, 6, mask_prob_max=0.5)
        if len(set(x["semantic_types"][x["is_masked"] != 0].tolist())) >= 3
    )
    dev = {k: jnp.asarray(b[k]) for k in M.MODEL_KEYS}
    out = {k: np.asarray(v, np.float64) for k, v in M.forward(params, dev, col, cat, cfg).items()}
    assert out["numeric"].shape == (B * (1 + b["mask_pos"].shape[1]),)
    loss, _ = M.compute_loss({k: jnp.asarray(v, jnp.float32) for k, v in out.items()}, dev, cfg)
    np.testing.assert_allclose(float(loss), _np_loss(out, b, cfg), rtol=1e-4)
    # Without the masked slots the loss is the seeds' targets alone: another value.
    seeds_only = {k: v for k, v in dev.items() if not k.startswith("mask_")}
    alone, _ = M.compute_loss(
        M.forward(params, seeds_only, col, cat, cfg), seeds_only, cfg
    )
    assert abs(float(alone) - float(loss)) > 1e-4
