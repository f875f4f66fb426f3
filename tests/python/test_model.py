"""The JAX relational transformer (``headwater.model.transformer``, ``headwater.model.optim``).

Overfitting a fixed set of real sampler batches, the loss dispatch
against a NumPy reference, NaN-free gradients on padding-heavy batches with
null targets, no target leakage, attention masks against a brute-force NumPy
construction, padding invisible to real cells, determinism, the ``pmean``
path, the Muon/AdamW partition and the host → device padding.

Everything runs on the CPU backend with small shapes; the train step is
compiled once for the default config and shared (``make_train_step`` is
cached per config).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SmallData, build_small_db

pytest.importorskip("jax")
pytest.importorskip("optax")

import jax
import jax.numpy as jnp

from headwater import _native
from headwater.model import attention as A
from headwater.model import device as DV
from headwater.model import transformer as M
from headwater.model.optim import MUON_WEIGHTS, OptConfig, param_labels

B, S = 8, 32
OVERFIT_STEPS = 200
#: The mean loss over the fixed batch set must fall at least this much.
OVERFIT_FACTOR = 20.0
OPT = OptConfig(warmup_steps=20, total_steps=OVERFIT_STEPS)
HEADS = ("numeric", "boolean", "timestamp", "categorical")


@dataclass
class Setup:
    db: Path
    cfg: M.ModelConfig
    col: Any
    cat: Any
    np_batches: list[dict[str, np.ndarray]]  # one per task, round robin
    batches: list[dict[str, Any]]
    params: dict[str, Any]
    forward: Any  # jitted (params, batch) -> outputs, shared by the tests


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Iterator[Setup]:
    small = build_small_db(tmp_path_factory.mktemp("model"), small_data)
    sampler = _native.Sampler(
        small.path, default_batch_size=B, default_sequence_length=S, task_pick="round_robin"
    )
    try:
        np_batches = [sampler.next_train_batch() for _ in range(6)]
        col, cat = DV.tables_to_device(sampler.column_embeddings(), sampler.categorical_embeddings())
        meta = sampler.database_metadata()
    finally:
        sampler.shutdown()
    assert sorted(int(b["target_stype"][0]) for b in np_batches) == [0, 0, 1, 2, 3, 3]
    cfg = M.ModelConfig(max_categories=M.max_categories(meta))
    # One static shape for the whole set: one compilation.
    text_rows = max(DV.bucket_size(b["text_batch_embeddings"].shape[0]) for b in np_batches)
    fk_rows = max(DV.bucket_size(b["fk_adj"].shape[1]) for b in np_batches)
    batches = [DV.batch_to_device(b, text_rows=text_rows, fk_rows=fk_rows) for b in np_batches]
    params = M.init_params(jax.random.key(0), cfg, int(col.shape[1]))
    fwd = jax.jit(lambda p, b: M.forward(p, b, col, cat, cfg))
    yield Setup(small.path, cfg, col, cat, np_batches, batches, params, fwd)


def _np_tree(tree: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _mean_loss(s: Setup, params: Any) -> float:
    ev = M.make_eval_step(s.cfg)
    return float(np.mean([float(ev(params, b, s.col, s.cat)["loss"]) for b in s.batches]))


# ----------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------


def test_overfits_a_fixed_batch_set(setup: Setup) -> None:
    step = M.make_train_step(setup.cfg, OPT)
    params, opt_state = setup.params, M.init_opt_state(setup.params, OPT)
    before = _mean_loss(setup, params)
    losses = []
    for i in range(OVERFIT_STEPS):
        params, opt_state, metrics = step(
            params, opt_state, setup.batches[i % len(setup.batches)], setup.col, setup.cat
        )
        losses.append(metrics["loss"])
    assert np.isfinite(np.asarray(losses)).all()
    after = _mean_loss(setup, params)
    print(f"overfit: mean loss {before:.4f} -> {after:.5f} ({before / after:.0f}x)")
    assert after * OVERFIT_FACTOR <= before, (before, after)


def test_training_is_deterministic(setup: Setup) -> None:
    again = M.init_params(jax.random.key(0), setup.cfg, int(setup.col.shape[1]))
    assert all(np.array_equal(a, b) for a, b in zip(_np_tree(setup.params), _np_tree(again), strict=False))
    other = M.init_params(jax.random.key(1), setup.cfg, int(setup.col.shape[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(_np_tree(setup.params), _np_tree(other), strict=False))

    step = M.make_train_step(setup.cfg, OPT)

    def run() -> list[np.ndarray]:
        p = M.init_params(jax.random.key(0), setup.cfg, int(setup.col.shape[1]))
        st = M.init_opt_state(p, OPT)
        for i in range(4):
            p, st, _ = step(p, st, setup.batches[i], setup.col, setup.cat)
        return _np_tree(p)

    assert all(np.array_equal(a, b) for a, b in zip(run(), run(), strict=False))


def test_pmean_over_an_axis(setup: Setup) -> None:
    """Under a named axis (here ``vmap``; ``shard_map``/``pmap`` alike) the
    step averages loss and gradients over it: two copies of one batch give
    the single-device step, two different batches give the mean loss and
    the same parameters on both members. (The single-device step is the one
    the other tests compiled for these shapes.)"""
    cfg, params = setup.cfg, setup.params
    st = M.init_opt_state(params, OPT)
    single = M.make_train_step(cfg, OPT)
    multi = jax.vmap(
        M.make_train_step(cfg, OPT, axis_name="dev"),
        in_axes=(None, None, 0, None, None),
        axis_name="dev",
    )
    a, b = setup.batches[0], setup.batches[2]

    def run(x: dict[str, Any], y: dict[str, Any]) -> tuple[list[np.ndarray], float]:
        both = jax.tree.map(lambda u, v: jnp.stack([u, v]), x, y)
        p, _, m = multi(params, st, both, setup.col, setup.cat)
        return _np_tree(p), float(np.asarray(m["loss"])[0])

    p1, _, m1 = single(params, st, a, setup.col, setup.cat)
    p_aa, loss_aa = run(a, a)
    for x, y in zip(_np_tree(p1), p_aa, strict=False):
        np.testing.assert_allclose(y[0], x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss_aa, float(m1["loss"]), rtol=1e-6)
    _, loss_bb = run(b, b)
    p_ab, loss_ab = run(a, b)
    np.testing.assert_allclose(loss_ab, (loss_aa + loss_bb) / 2, rtol=1e-5)
    for y in p_ab:  # averaged gradients: one update for both members
        np.testing.assert_array_equal(y[0], y[1])


def test_muon_gets_hidden_matrices_adam_the_rest(setup: Setup) -> None:
    labels = param_labels(setup.params)
    flat = jax.tree_util.tree_leaves_with_path(labels)
    muon = {str(p[-1].key) for p, lab in flat if lab == "muon"}
    assert muon == set(MUON_WEIGHTS)
    assert labels["enc"]["bool_emb"] == "adam"  # 2-D, but an embedding
    assert labels["head"]["numeric_w"] == "adam"  # 2-D, but an output layer
    assert labels["blocks"]["attn_norm"] == "adam"
    assert setup.params["blocks"]["wqkv"].shape == (2, 3, 3, 64, 64)


# ----------------------------------------------------------------------------
# Loss dispatch (the loss dispatch)
# ----------------------------------------------------------------------------


def _dispatch_case(stype: int, rng: np.random.Generator, k: int = 6) -> tuple[dict, dict]:
    b = 5
    batch = {
        "is_target": np.zeros((b, 3), np.uint8),
        "is_null": np.zeros((b, 3), np.uint8),
        "numeric_values": rng.normal(size=(b, 3)).astype(np.float32),
        "bool_values": rng.integers(0, 2, (b, 3)).astype(np.uint8),
        "timestamp_values": rng.normal(size=(b, 3, 15)).astype(np.float32),
        "categorical_embed_ids": (10 + rng.integers(0, 4, (b, 3))).astype(np.uint32),
        "target_stype": np.array([stype], np.uint8),
        "cat_emb_start": np.array([10], np.uint32),
        "cat_emb_count": np.array([4], np.uint32),
        "target_pos": np.zeros((b, 1), np.uint16),  # one segment per sequence
        "target_count": np.ones(b, np.uint8),
    }
    batch["is_target"][:, 0] = 1
    batch["is_null"][1, 0] = 1  # one null target
    logits = rng.normal(size=(b, k)).astype(np.float32)
    logits[:, 4:] = A.MASK_FILL
    outputs = {
        "numeric": rng.normal(size=b).astype(np.float32),
        "boolean": rng.normal(size=b).astype(np.float32),
        "timestamp": rng.normal(size=(b, 15)).astype(np.float32),
        "categorical": logits,
        "null": rng.normal(size=b).astype(np.float32),
    }
    return batch, outputs


def _reference_loss(batch: dict, out: dict, delta: float) -> float:
    def bce(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))

    y_null = batch["is_null"][:, 0].astype(np.float64)
    err = np.abs(out["numeric"] - batch["numeric_values"][:, 0])
    num = np.where(err <= delta, 0.5 * err**2, delta * (err - 0.5 * delta))
    boolean = bce(out["boolean"], batch["bool_values"][:, 0])
    ts = np.mean((out["timestamp"] - batch["timestamp_values"][:, 0]) ** 2, axis=1)
    lg = out["categorical"][:, :4].astype(np.float64)
    y = batch["categorical_embed_ids"][:, 0].astype(np.int64) - 10
    lse = np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) + lg.max(1)
    cat = lse - lg[np.arange(len(y)), y]
    type_loss = [num, boolean, ts, cat][int(batch["target_stype"][0])]
    return float(np.mean(bce(out["null"], y_null) + (1 - y_null) * type_loss))


@pytest.mark.parametrize("stype", range(4))
def test_loss_dispatch_selects_the_target_type_head(stype: int) -> None:
    cfg = M.ModelConfig(max_categories=6)
    batch, outputs = _dispatch_case(stype, np.random.default_rng(stype))
    loss_of = jax.jit(lambda o, b: M.compute_loss(o, b, cfg)[0])
    base = float(loss_of(outputs, batch))
    np.testing.assert_allclose(base, _reference_loss(batch, outputs, cfg.huber_delta), rtol=1e-5)
    for i, head in enumerate(HEADS):
        moved = dict(outputs)
        moved[head] = outputs[head] + np.float32(0.7)
        if head == "categorical":  # shift one valid logit (a uniform shift is invisible)
            moved[head] = outputs[head].copy()
            moved[head][:, 0] += 0.7
        changed = float(loss_of(moved, batch)) != base
        assert changed == (i == stype), (head, stype)
    moved = dict(outputs, null=outputs["null"] + np.float32(0.7))
    assert float(loss_of(moved, batch)) != base  # the null head always counts
    # An all-null batch: no type head counts.
    batch["is_null"][:, 0] = 1
    base = float(loss_of(outputs, batch))
    for head in HEADS:
        moved = dict(outputs, **{head: outputs[head] + np.float32(0.7)})
        assert float(loss_of(moved, batch)) == base, head


# ----------------------------------------------------------------------------
# Numerics, leakage, masks
# ----------------------------------------------------------------------------


def test_gradients_are_finite_on_padding_heavy_batches(setup: Setup) -> None:
    """S = 256 with one row per sequence (max_hops = 0: ~5 cells, ~98 %
    padding), once as sampled and once with every target cell null."""
    sampler = _native.Sampler(
        setup.db,
        default_batch_size=4,
        default_sequence_length=256,
        max_hops=0,
        task_pick="round_robin",
    )
    try:
        raw = [sampler.next_train_batch() for _ in range(2)]
    finally:
        sampler.shutdown()
    assert all(b["is_padding"].mean() > 0.95 for b in raw)
    all_null = dict(raw[1])
    all_null["is_null"] = raw[1]["is_null"].copy()
    all_null["is_null"][:, 0] = 1
    grad = jax.jit(
        jax.value_and_grad(lambda p, b: M.loss_fn(p, b, setup.col, setup.cat, setup.cfg)[0])
    )
    for np_batch in (raw[0], raw[1], all_null):
        batch = DV.batch_to_device(np_batch, text_rows=64, fk_rows=64)
        loss, grads = grad(setup.params, batch)
        assert np.isfinite(float(loss))
        for path, g in jax.tree_util.tree_leaves_with_path(grads):
            assert np.all(np.isfinite(np.asarray(g))), jax.tree_util.keystr(path)
    # All-null targets: the type heads get no gradient, the null head does.
    assert np.all(np.asarray(grads["head"]["numeric_w"]) == 0)
    assert np.all(np.asarray(grads["head"]["cat_w"]) == 0)
    assert np.any(np.asarray(grads["head"]["null_w"]) != 0)


def test_target_value_does_not_reach_the_output(setup: Setup) -> None:
    fwd = setup.forward
    rng = np.random.default_rng(0)
    for np_batch, batch in zip(setup.np_batches, setup.batches, strict=False):
        out = fwd(setup.params, batch)
        tampered = {k: np.array(v) for k, v in batch.items()}
        tampered["numeric_values"][:, 0] = rng.normal(size=B) * 100
        tampered["timestamp_values"][:, 0] = rng.normal(size=(B, 15))
        tampered["bool_values"][:, 0] ^= 1
        tampered["is_null"][:, 0] ^= 1
        start, count = int(np_batch["cat_emb_start"][0]), int(np_batch["cat_emb_count"][0])
        tampered["categorical_embed_ids"][:, 0] = start + rng.integers(0, max(count, 1), B)
        tampered["numeric_values"][1, 0] = np.nan
        out2 = fwd(setup.params, tampered)
        for k in out:
            np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(out2[k]), err_msg=k)
    # The check can fail: a non-target numeric cell does change the output.
    is_num = (
        (setup.np_batches[0]["semantic_types"] == 0)
        & (setup.np_batches[0]["is_target"] == 0)
        & (setup.np_batches[0]["is_null"] == 0)
        & (setup.np_batches[0]["is_padding"] == 0)
    )
    assert is_num.any()
    tampered = {k: np.array(v) for k, v in setup.batches[0].items()}
    tampered["numeric_values"][is_num] += 3.0
    out, out2 = fwd(setup.params, setup.batches[0]), fwd(setup.params, tampered)
    assert not np.array_equal(np.asarray(out["numeric"]), np.asarray(out2["numeric"]))


def test_qk_normalisation_has_a_finite_gradient_at_zero() -> None:
    """``q / max(||q||, 1e-6)`` written with ``jnp.linalg.norm`` has a NaN
    gradient at ``q = 0`` (sqrt'(0) = inf times a zero cotangent); the
    model's form computes the same function with a finite gradient."""
    zero = jnp.zeros((4,), jnp.float32)
    naive = jax.grad(lambda x: (x / jnp.maximum(jnp.linalg.norm(x), 1e-6)).sum())(zero)
    assert np.isnan(np.asarray(naive)).all()
    assert np.isfinite(np.asarray(jax.grad(lambda x: A._l2_normalize(x).sum())(zero))).all()
    x = jnp.asarray([3.0, -4.0, 0.0, 1e-9])
    np.testing.assert_allclose(
        A._l2_normalize(x), x / jnp.maximum(jnp.linalg.norm(x), 1e-6), rtol=1e-6
    )


def _brute_force_masks(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n_seq, s = b["column_ids"].shape
    out = {k: np.zeros((n_seq, s, s), bool) for k in A.ATTENTION_KINDS}
    for q in range(n_seq):
        rows, cols, pad, adj = (
            b["seq_row_ids"][q],
            b["column_ids"][q],
            b["is_padding"][q],
            b["fk_adj"][q],
        )
        for i in range(s):
            for j in range(s):
                if i == j:
                    for m in out.values():
                        m[q, i, j] = True
                    continue
                if pad[i] or pad[j]:
                    continue
                o, n = bool(adj[rows[i], rows[j]]), bool(adj[rows[j], rows[i]])
                out["column"][q, i, j] = cols[i] == cols[j]
                out["feature"][q, i, j] = rows[i] == rows[j]
                out["outbound"][q, i, j] = o
                out["inbound"][q, i, j] = n
                out["neighbour"][q, i, j] = o or n
    return out


def test_attention_masks_match_brute_force(setup: Setup) -> None:
    np_batch = setup.np_batches[2]  # user_country: a parent seed with children
    assert np_batch["fk_adj"].any() and np_batch["is_padding"].any()
    got = jax.jit(lambda b: A.attention_masks(b, A.ATTENTION_KINDS))(setup.batches[2])
    want = _brute_force_masks(np_batch)
    for kind in A.ATTENTION_KINDS:
        np.testing.assert_array_equal(np.asarray(got[kind]), want[kind], err_msg=kind)
    pad = np_batch["is_padding"].astype(bool)
    for kind, m in got.items():
        m = np.asarray(m)
        # No real cell attends to padding; padding attends only to itself.
        assert not (m & pad[:, None, :] & ~pad[:, :, None]).any(), kind
        assert (m.sum(-1)[pad] == 1).all(), kind
        assert np.diagonal(m, axis1=1, axis2=2).all(), kind


def test_padding_is_invisible_to_real_cells(setup: Setup) -> None:
    """Changing every input of the padding cells leaves the hidden state of
    every real cell, and the decoder outputs, bit-identical."""
    hid = jax.jit(lambda p, b: M.hidden_states(p, b, setup.col, setup.cat, setup.cfg))
    fwd = setup.forward
    rng = np.random.default_rng(1)
    for np_batch, batch in zip(setup.np_batches, setup.batches, strict=False):
        pad = np_batch["is_padding"].astype(bool)
        if not pad.any():
            continue
        n = int(pad.sum())
        t = {k: np.array(v) for k, v in batch.items()}
        t["semantic_types"][pad] = rng.integers(0, 5, n)
        # Same column and row as the target cell: still invisible.
        t["column_ids"][pad] = np_batch["column_ids"][0, 0]
        t["seq_row_ids"][pad] = np_batch["seq_row_ids"][0, 0]
        t["numeric_values"][pad] = rng.normal(size=n) * 50
        t["timestamp_values"][pad] = rng.normal(size=(n, 15))
        t["bool_values"][pad] = 1
        t["is_null"][pad] = rng.integers(0, 2, n)
        h1, h2 = np.asarray(hid(setup.params, batch)), np.asarray(hid(setup.params, t))
        np.testing.assert_array_equal(h1[~pad], h2[~pad])
        assert not np.array_equal(h1[pad], h2[pad])  # padding itself did change
        assert np.all(np.abs(h1[pad].astype(np.float32)).sum(-1) > 0)  # and is never zeroed
        o1, o2 = fwd(setup.params, batch), fwd(setup.params, t)
        for k in o1:
            np.testing.assert_array_equal(np.asarray(o1[k]), np.asarray(o2[k]), err_msg=k)


# ----------------------------------------------------------------------------
# Host → device
# ----------------------------------------------------------------------------


def test_batch_to_device_pads_to_static_buckets(setup: Setup) -> None:
    raw = setup.np_batches[0]
    assert "fingerprint" in raw
    dev = DV.batch_to_device(raw)
    assert list(dev) == list(M.MODEL_KEYS)
    assert list(M.MODEL_KEYS) == [*_native.BATCH_KEYS, *M.SEGMENT_KEYS, *M.TARGET_KEYS]
    u, r = raw["text_batch_embeddings"].shape[0], raw["fk_adj"].shape[1]
    assert dev["text_batch_embeddings"].shape == (
        DV.bucket_size(u),
        raw["text_batch_embeddings"].shape[1],
    )
    assert dev["fk_adj"].shape == (B, DV.bucket_size(r), DV.bucket_size(r))
    for k in M.MODEL_KEYS:
        assert dev[k].dtype == raw[k].dtype, k
    np.testing.assert_array_equal(
        np.asarray(dev["text_batch_embeddings"])[:u], raw["text_batch_embeddings"]
    )
    assert not np.asarray(dev["text_batch_embeddings"])[u:].any()
    np.testing.assert_array_equal(np.asarray(dev["fk_adj"])[:, :r, :r], raw["fk_adj"])
    assert not np.asarray(dev["fk_adj"]).sum() - raw["fk_adj"].sum()
    assert [DV.bucket_size(n) for n in (0, 1, 64, 65, 1024, 1025, 1500, 5000)] == [
        64,
        64,
        64,
        128,
        1024,
        1152,
        1536,
        5120,
    ]
    assert all(
        DV.bucket_size(n) >= n and DV.bucket_size(n) <= 1.125 * n + 64 for n in range(1, 20000, 37)
    )
    with pytest.raises(ValueError, match="max_categories"):
        DV.batch_to_device(setup.np_batches[2], max_categories=1)
    with pytest.raises(ValueError, match="fk_rows"):
        DV.batch_to_device(raw, fk_rows=r - 1)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        M.ModelConfig(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="attention"):
        M.ModelConfig(attention=("everything",))
    with pytest.raises(ValueError, match="total_steps"):
        OptConfig(warmup_steps=10, total_steps=5)
