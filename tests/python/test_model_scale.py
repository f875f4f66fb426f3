"""The model's speed and scale options against their reference paths.

Fused attention (``attention_impl = "fused"``) and one-hot reads of small
tables (``onehot_max_rows``) against the dense, gathering reference on real
batches of the small database, packed and unpacked: outputs and gradients
equal to a stated tolerance. Tiny models (d 16, one layer), float32 where
the tolerance is tight; one compilation per config and batch shape.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from conftest import SmallData, build_small_db

pytest.importorskip("jax")

import jax
import jax.numpy as jnp

from headwater import _native
from headwater.model import attention as A
from headwater.model import device as DV
from headwater.model import transformer as M

B, S = 4, 32
#: float32 compute: fused vs dense, one-hot vs gather (relative to the
#: largest magnitude of each array).
TOL_F32 = 2e-5
#: bfloat16 compute: the fused path multiplies bfloat16 probabilities by
#: bfloat16 values where dense stays in float32 (8 mantissa bits: ~4e-3).
TOL_BF16 = 5e-2


@dataclass
class Case:
    db: Any
    col: Any
    cat: Any
    batches: dict[str, dict[str, Any]]  # "unpacked" / "packed" -> device batch
    base: M.ModelConfig
    params: Any


def _batch(small: Any, **kw: Any) -> tuple[dict[str, Any], Any, Any, dict[str, Any]]:
    s = _native.Sampler(
        small.path, default_batch_size=B, task_pick="round_robin", num_threads=1, **kw
    )
    try:
        # The fourth task in round robin has a categorical target.
        raw = [s.next_train_batch() for _ in range(4)]
        col, cat = DV.tables_to_device(s.column_embeddings(), s.categorical_embeddings())
        meta = s.database_metadata()
    finally:
        s.shutdown()
    b = max(raw, key=lambda r: int(r["target_stype"][0]) == M.CATEGORICAL)
    return DV.batch_to_device(b), col, cat, meta


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Iterator[Case]:
    small = build_small_db(tmp_path_factory.mktemp("scale"), small_data)
    unpacked, col, cat, meta = _batch(small, default_sequence_length=S)
    packed, _, _, _ = _batch(small, default_sequence_length=2 * S, pack=True, pack_factor=2)
    assert int(np.max(np.asarray(packed["target_count"]))) > 1
    base = M.ModelConfig(
        d_model=16,
        num_layers=1,
        num_heads=2,
        max_categories=M.max_categories(meta),
        compute_dtype="float32",
        onehot_max_rows=0,
    )
    params = M.init_params(0, base, int(col.shape[1]))
    yield Case(small.path, col, cat, {"unpacked": unpacked, "packed": packed}, base, params)


def _run(c: Case, cfgs: tuple[M.ModelConfig, ...], batch: dict[str, Any]) -> list[Any]:
    """``(outputs, gradients)`` under each config, from one compilation."""

    def one(cfg: M.ModelConfig, p: Any) -> tuple[Any, Any]:
        def f(p: Any) -> tuple[Any, Any]:
            out = M.forward(p, batch, c.col, c.cat, cfg)
            return M.compute_loss(out, batch, cfg)[0], out

        (_, out), grads = jax.value_and_grad(f, has_aux=True)(p)
        return out, grads

    return jax.jit(lambda p: [one(cfg, p) for cfg in cfgs])(c.params)


def _close(a: Any, b: Any, tol: float) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        assert np.all(np.isfinite(x)) and np.all(np.isfinite(y))
        scale = max(float(np.max(np.abs(y))), 1e-3)
        assert float(np.max(np.abs(x - y))) <= tol * scale, (float(np.max(np.abs(x - y))), scale)


def _valid_outputs(out: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """Outputs of the real targets only (packed slots past ``target_count``
    read whatever cell sits at position 0)."""
    w = np.asarray(M.target_weights(batch)) > 0
    return {k: np.asarray(v)[w] for k, v in out.items()}


@pytest.mark.parametrize("kind", ["unpacked", "packed"])
def test_fused_attention_and_onehot_match_the_reference(case: Case, kind: str) -> None:
    batch = case.batches[kind]
    fast = dataclasses.replace(case.base, attention_impl="fused", onehot_max_rows=M.ONEHOT_MAX_ROWS)
    (ref_out, ref_grads), (out, grads) = _run(case, (case.base, fast), batch)
    _close(_valid_outputs(out, batch), _valid_outputs(ref_out, batch), TOL_F32)
    _close(grads, ref_grads, TOL_F32)


def test_fused_attention_in_bfloat16(case: Case) -> None:
    batch = case.batches["unpacked"]
    bf = dataclasses.replace(case.base, compute_dtype="bfloat16")
    fused = dataclasses.replace(bf, attention_impl="fused")
    (ref_out, ref_grads), (out, grads) = _run(case, (bf, fused), batch)
    _close(_valid_outputs(out, batch), _valid_outputs(ref_out, batch), TOL_BF16)
    _close(grads, ref_grads, TOL_BF16)


def test_a_query_with_no_key_gets_zero_and_finite_gradients() -> None:
    rng = np.random.default_rng(0)
    d, h, s = 8, 2, 6
    x = jnp.asarray(rng.standard_normal((1, s, d)), jnp.float32)
    wqkv = jnp.asarray(rng.standard_normal((3, d, d)), jnp.float32)
    wo = jnp.asarray(np.eye(d), jnp.float32)
    mask = np.ones((1, s, s), bool)
    mask[0, 2] = False  # query 2 may see nothing
    mask = jnp.asarray(mask)

    def f(x: Any, wqkv: Any, impl: str) -> Any:
        return A._attention(wqkv, wo, jnp.full((h,), 8.0), x, mask, h, jnp.float32, impl)

    def both(x: Any, wqkv: Any) -> Any:
        outs = [f(x, wqkv, impl) for impl in A.ATTENTION_IMPLS]
        grads = [
            jax.grad(lambda x, w, i=i: jnp.sum(f(x, w, i) ** 2), argnums=(0, 1))(x, wqkv)
            for i in A.ATTENTION_IMPLS
        ]
        return outs, grads

    outs, grads = jax.jit(both)(x, wqkv)
    for out in outs:
        out = np.asarray(out)
        assert np.all(out[0, 2] == 0) and np.all(np.isfinite(out))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads))
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[1]), atol=1e-5)


def test_onehot_take_equals_gather() -> None:
    table = jnp.asarray(np.random.default_rng(1).standard_normal((5, 3)), jnp.float32)
    ids = jnp.asarray([[0, 4, 4, 7, -1]])  # out of range ids clip, as the gather does
    np.testing.assert_array_equal(M._take(table, ids, 5), M._take(table, ids, 0))


def test_grad_accum_gives_the_large_batch_update(case: Case) -> None:
    """One step of ``grad_accum = 2`` (two micro-batches of 2) against one
    step on the batch of 4: equal parameters within a float32 tolerance."""
    from headwater.model.optim import OptConfig

    opt = OptConfig(warmup_steps=0, total_steps=10)
    batch = case.batches["unpacked"]
    state = M.init_opt_state(case.params, opt)
    out = []
    for g in (1, 2):
        # g = 1 is the bench test's cached step (the same arguments).
        step = M.make_train_step(case.base, opt, **({"grad_accum": g} if g > 1 else {}))
        params, _, metrics = step(case.params, state, batch, case.col, case.cat)
        out.append((params, float(metrics["loss"])))
    (p1, l1), (p2, l2) = out
    assert abs(l1 - l2) <= 1e-5 * abs(l1)
    _close(p2, p1, TOL_F32)
    with pytest.raises(ValueError, match="grad_accum"):
        M.make_train_step(case.base, opt, grad_accum=0)


def test_presets_and_bad_model_config_are_config_errors(tmp_path: Any) -> None:
    import headwater
    from headwater.runconfig.config import load_config

    cfg = load_config({"model": {"preset": "rt", "num_layers": 2}})
    assert (cfg.model.d_model, cfg.model.num_layers, cfg.model.num_heads) == (256, 2, 8)
    assert cfg.model.d_model * cfg.model.mlp_ratio == 1024
    rtj = load_config({"model": {"preset": "rt-j"}}).model
    assert (rtj.d_model, rtj.num_layers, rtj.d_model * rtj.mlp_ratio) == (512, 12, 2048)
    assert load_config({}).model.d_model == M.ModelConfig().d_model
    toml = tmp_path / "bad.toml"
    cases = {
        '[model]\npreset = "huge"\n': r"bad.toml:2: `model.preset` must be one of default, rt, rt-j",
        "[train]\ngrad_accum = 0\n": r"bad.toml:2: .*grad_accum must be >= 1",
        "[train]\ngrad_accum = 3\n": r"bad.toml:2: `train.grad_accum` \(3\) must divide .* 1, 2, 4, 8",
        "[model]\nd_model = 30\nnum_heads = 4\n": r"bad.toml:3: .*num_heads \(4\) must divide d_model \(30\): one of 1, 2, 3, 5",
        '[model]\nremat = "some"\n': r"bad.toml:2: .*remat must be one of none, full, dots_saveable",
        '[model]\nattention_impl = "flash"\n': r"bad.toml:2: .*attention_impl must be one of dense, fused",
        '[model]\ncat_head_impl = "onehot"\n': r"bad.toml:2: .*cat_head_impl must be one of auto, gather, matmul, got 'onehot'",
        "[model]\ncat_chunk_mib = -1\n": r"bad.toml:2: .*cat_chunk_mib must be >= 0, got -1",
    }
    for text, pattern in cases.items():
        toml.write_text(text)
        with pytest.raises(headwater.ConfigError, match=pattern):
            load_config(toml)
    for key, value in (("cat_head_impl", "onehot"), ("cat_chunk_mib", -1)):
        with pytest.raises(headwater.ConfigError) as err:
            load_config({"model": {key: value}})
        assert (err.value.key, err.value.value) == (f"model.{key}", json.dumps(value))


def test_flops_per_step_match_a_hand_count() -> None:
    from headwater.model import scale
    from headwater.train import throughput

    cfg = M.ModelConfig(
        d_model=4, num_layers=1, num_heads=1, mlp_ratio=2, attention=("column",), max_categories=8
    )
    # B 2, S 3: T 6 tokens, N 2 targets, d 4, f 8, one kind.
    qkv_out = 6 * (2 * 4 * 12 + 2 * 4 * 4)  # 768
    scores_pv = 2 * (2 * 2 * 3 * 3 * 4)  # 288
    mlp = 2 * (2 * 6 * 4 * 8)  # 768
    timestamp = 2 * 6 * 15 * 4  # 720
    heads = 2 * 2 * 4 * (4 + 1 + 1 + 15 + 1) + 2 * 2 * 4 * 8  # 480
    hand = 3 * (qkv_out + scores_pv + mlp + timestamp + heads)
    assert scale.train_flops_per_step(cfg, 2, 3) == hand == 9072
    assert throughput.mfu(989e12, 0.5, 1, "NVIDIA H100 80GB HBM3") == pytest.approx(0.5)
    assert throughput.mfu(1e12, 1.0, 1, "cpu") is None
    t = {"tokens_per_second": 1e3, "model_flops_per_step": 2e9, "device_kind": "cpu", "mfu": None}
    assert "MFU not known" in throughput.format_throughput(t)
    assert "MFU 12.5%" in throughput.format_throughput({**t, "device_kind": "H", "mfu": 0.125})


def test_bench_model_times_the_device_step(case: Case) -> None:
    """``headwater bench --model`` (its function, in process) on a CPU with
    the tiny model of these tests (its train step is already compiled by the
    grad-accum test): the step's figures, no MFU nor peak memory on a CPU."""
    import headwater
    from headwater.bench import step as step_bench

    keys = ("d_model", "num_layers", "num_heads", "compute_dtype", "onehot_max_rows")
    sets = step_bench.parse_model_sets([f"{k}={json.dumps(getattr(case.base, k))}" for k in keys])
    assert sets["num_layers"] == 1 and sets["compute_dtype"] == "float32"
    r = step_bench.run_step_bench(case.db, ["default"], B, S, sets, rounds=1)
    (res,) = r["step_bench"]
    assert res["preset"] == "default" and res["model"]["d_model"] == case.base.d_model
    assert (res["batch_size"], res["seq_len"]) == (B, S)
    assert res["forward_ms"] > 0 and res["step_ms"] > 0 and res["tokens_per_second"] > 0
    assert res["mfu"] is None and res["model_flops_per_step"] > 0
    with pytest.raises(headwater.ConfigError, match="one of default, rt, rt-j"):
        step_bench.run_step_bench(case.db, ["huge"], B, S, {})


# ----------------------------------------------------------------------------
# The categorical head in bounded memory (headwater.model.cat_head)
# ----------------------------------------------------------------------------

#: A window far wider than the small database's 4 categories, so that
#: ``[N, C, d]`` dominates the step and 1 MiB chunks split ``N``.
WIDE_C = 512


def _targeted(batch: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Type and categorical window start of each real target."""
    w = np.asarray(M.target_weights(batch)) > 0
    stype = np.asarray(M.per_target(batch, "target_stype"))[w]
    return stype, np.asarray(M.per_target(batch, "cat_emb_start"))[w]


@pytest.fixture(scope="module")
def masked(case: Case) -> dict[str, dict[str, Any]]:
    """Batches with masked cells (``mask_prob_max`` 0.5): unpacked with mixed
    tasks (``task_mixing = "sequence"``), packed with one task per batch."""
    out = {}
    for kind, kw in {
        "mixed": {"default_sequence_length": S, "task_mixing": "sequence"},
        "packed": {"default_sequence_length": 2 * S, "pack": True, "pack_factor": 2},
    }.items():
        s = _native.Sampler(
            case.db, default_batch_size=B, mask_prob_max=0.5, num_threads=1, telemetry=False, **kw
        )
        try:
            b = DV.batch_to_device(s.next_train_batch())
        finally:
            s.shutdown()
        stype, start = _targeted(b)
        # Masked targets of every type, categorical ones in several windows.
        assert b["mask_pos"].shape[1] > 0 and set(stype) == {0, 1, 2, 3}
        assert len(set(start[stype == M.CATEGORICAL])) > 1
        out[kind] = b
    assert len(set(np.asarray(out["mixed"]["seq_target_stype"]))) > 1
    return out


def test_chunked_and_matmul_categorical_heads_equal_the_gather(
    case: Case, masked: dict[str, dict[str, Any]]
) -> None:
    """Every head form against all windows gathered at once, on a real batch
    of mixed tasks with masked cells: outputs and gradients within 1e-5
    (float32). (The packed batch: the remat / grad-accum test below.)"""
    from headwater.model import cat_head as CH

    batch = masked["mixed"]
    wide = dataclasses.replace(case.base, max_categories=WIDE_C)
    bf16 = dataclasses.replace(case.base, compute_dtype="bfloat16")
    n = int(M.target_weights(batch).shape[0])
    # 1 MiB holds fewer targets' windows than the batch has: several chunks.
    assert CH.chunk_targets(WIDE_C * wide.d_model, 1) < n
    # (reference, form, gradient tolerance): at the database's own window
    # ``auto`` is the matmul (10 rows); in bfloat16 the gather's table
    # gradient is a bfloat16 scatter-add, the matmul's a float32 product.
    pairs = [
        (wide, dataclasses.replace(wide, cat_chunk_mib=1, cat_head_impl="gather"), 1e-5),
        (wide, dataclasses.replace(wide, cat_chunk_mib=1, cat_head_impl="matmul"), 1e-5),
        (case.base, dataclasses.replace(case.base, cat_head_impl="auto"), 1e-5),
        (bf16, dataclasses.replace(bf16, cat_head_impl="auto"), TOL_BF16),
    ]
    pairs = [
        (dataclasses.replace(ref, cat_chunk_mib=0, cat_head_impl="gather"), form, tol)
        for ref, form, tol in pairs
    ]
    rows = int(case.cat.shape[0])
    assert all(
        CH.pick_impl("auto", rows, f.max_categories, f.d_model) == "matmul" for _, f, _ in pairs[2:]
    )
    runs = _run(case, tuple(cfg for ref, form, _ in pairs for cfg in (ref, form)), batch)
    for i, (_, _, tol) in enumerate(pairs):
        (ref_out, ref_grads), (out, grads) = runs[2 * i], runs[2 * i + 1]
        _close(_valid_outputs(out, batch), _valid_outputs(ref_out, batch), 1e-5)
        _close(grads, ref_grads, tol)


def test_chunked_head_under_remat_fused_attention_and_grad_accum(
    case: Case, masked: dict[str, dict[str, Any]]
) -> None:
    """Gradients of a packed batch with masked cells through the chunked
    head inside gradient accumulation's scan (two micro-batches), with
    fused attention and full remat, against one pass of the dense gathering
    reference."""
    from headwater.model.accum import accumulated_grads

    batch = masked["packed"]
    wide = dataclasses.replace(case.base, max_categories=WIDE_C)
    ref = dataclasses.replace(wide, cat_chunk_mib=0, cat_head_impl="gather")
    chunked = dataclasses.replace(wide, cat_chunk_mib=1, attention_impl="fused")

    def grads(cfg: M.ModelConfig, parts: int, p: Any) -> Any:
        fn = jax.value_and_grad(M.loss_fn, has_aux=True)
        return accumulated_grads(
            lambda p, b: fn(p, b, case.col, case.cat, cfg), M.target_weights, p, batch, parts
        )

    # remat wraps the layers, not the head: one policy shows they compose.
    runs = [(ref, 1), (dataclasses.replace(chunked, remat="full"), 2)]
    (ref_grads, ref_metrics), *others = jax.jit(
        lambda p: [grads(cfg, parts, p) for cfg, parts in runs]
    )(case.params)
    for g, m in others:
        _close(g, ref_grads, TOL_F32)
        _close(m, ref_metrics, TOL_F32)


def _grad_temp_bytes(case: Case, cfg: M.ModelConfig, batch: dict[str, Any]) -> int:
    """Temporary bytes of the compiled forward + backward (the train step
    without its optimiser update)."""
    params = M.init_params(0, cfg, int(case.col.shape[1]))
    grad_fn = jax.jit(jax.value_and_grad(M.loss_fn, has_aux=True), static_argnums=4)
    lowered = grad_fn.lower(params, batch, case.col, case.cat, cfg)
    return int(lowered.compile().memory_analysis().temp_size_in_bytes)


def test_forward_and_backward_never_hold_every_window(
    case: Case, masked: dict[str, dict[str, Any]]
) -> None:
    """Temporary memory of the compiled forward + backward at a window of
    1024 (no layers: they do not touch the head, and compile slowly): all
    windows at once need more than the ``[N, C, d]`` float32 tensor; in
    1 MiB chunks, by either form, it stays below."""
    batch = masked["mixed"]
    cfg = dataclasses.replace(case.base, max_categories=1024, num_layers=0)
    n = int(M.target_weights(batch).shape[0])
    windows = n * cfg.max_categories * cfg.d_model * 4
    ref_cfg = dataclasses.replace(cfg, cat_chunk_mib=0, cat_head_impl="gather")
    ref = _grad_temp_bytes(case, ref_cfg, batch)
    assert ref >= windows, (ref, windows)
    for impl in ("gather", "matmul"):
        chunked = dataclasses.replace(cfg, cat_chunk_mib=1, cat_head_impl=impl)
        got = _grad_temp_bytes(case, chunked, batch)
        assert got < windows, (impl, got, windows)


def test_matmul_head_in_chunks_of_a_large_table() -> None:
    """The matmul form over a table of 2^16 rows, several chunks of ``[chunk,
    V]`` scores: values and gradients (query and table) equal the gather's,
    windows clipped at the table's end included."""
    from headwater.model import cat_head as CH

    rng = np.random.default_rng(3)
    n, c, d, v = 40, 8, 4, 1 << 16
    q = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    table = jnp.asarray(rng.standard_normal((v, d)), jnp.float32)
    start = jnp.asarray(np.r_[rng.integers(0, v, n - 2), v - 3, v - 1], jnp.int32)
    count = jnp.full((n,), c)
    assert CH.chunk_targets(v, 1) < n  # 4 targets per MiB: 10 chunks

    def loss(q: Any, t: Any, mib: int, impl: str) -> Any:
        out = CH.categorical_logits(q, t, start, count, c, mib, impl)
        return jnp.sum(jnp.sin(out)), out

    def both(q: Any, t: Any) -> Any:
        return [
            jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(q, t, mib, impl)
            for mib, impl in ((0, "gather"), (1, "matmul"))
        ]

    ((_, ref), ref_g), ((_, out), g) = jax.jit(both)(q, table)
    _close(out, ref, 1e-5)
    _close(g, ref_g, 1e-5)
    assert CH.pick_impl("auto", v, c, d) == "gather"
    assert CH.pick_impl("auto", c * d // 8, c, d) == "matmul"


def test_matmul_head_reads_the_table_rounded_to_the_compute_dtype() -> None:
    """The projected table is bfloat16; left to itself XLA folds the
    projection into the matmul and skips that rounding (2e-3 apart from the
    gather). Both forms must score the same bfloat16 table."""
    from headwater.model import cat_head as CH

    rng = np.random.default_rng(4)
    v, width, d, n, c = 10, 384, 16, 68, 8
    emb = jnp.asarray(rng.standard_normal((v, width)), jnp.float16)
    w = jnp.asarray(rng.standard_normal((width, d)) / np.sqrt(width), jnp.float32)
    q = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    start = jnp.asarray(rng.integers(0, v, n), jnp.int32)

    def both(emb: Any, w: Any, q: Any) -> Any:
        table = M._project_table(emb, w, jnp.bfloat16)
        return [CH.window_logits(q, table, start, c, 0, impl) for impl in ("gather", "matmul")]

    ref, out = jax.jit(both)(emb, w, q)
    _close(out, ref, 1e-5)
