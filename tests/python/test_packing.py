"""Packing (``pack=True``): the packed batch from Python, segment isolation
in the model (perturbing one segment leaves every other segment's hidden
states and outputs bit-identical), the loss over real targets only, a train
step on packed batches, and the packing telemetry.

Small shapes on the CPU backend; the Rust integration tests
(``tests/integration/packing.rs``) check the layout rules and resume/replay.
"""

from __future__ import annotations

import json
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

import jax

from headwater import _native
from headwater.model import device as DV
from headwater.model import transformer as M
from headwater.model.optim import OptConfig

B, S, PF = 4, 128, 4
K = 2 * PF  # segment slots per sequence: 1 to K contexts, B·PF in a batch


@dataclass
class Packed:
    db: Path
    np_batches: list[dict[str, np.ndarray]]
    drained: dict[str, float]
    cfg: M.ModelConfig
    col: Any
    cat: Any
    params: Any


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Iterator[Packed]:
    small = build_small_db(tmp_path_factory.mktemp("packing"), small_data)
    s = _native.Sampler(
        small.path,
        default_batch_size=B,
        default_sequence_length=S,
        pack=True,
        pack_factor=PF,
        task_pick="round_robin",
        num_threads=1,
    )
    try:
        np_batches = [s.next_train_batch() for _ in range(4)]
        drained = s.drain_step_metrics()
        col, cat = DV.tables_to_device(s.column_embeddings(), s.categorical_embeddings())
        meta = s.database_metadata()
    finally:
        s.shutdown()
    cfg = M.ModelConfig(max_categories=M.max_categories(meta))
    params = M.init_params(jax.random.key(0), cfg, int(col.shape[1]))
    yield Packed(small.path, np_batches, drained, cfg, col, cat, params)


def test_every_drawn_seed_is_one_sequence_target(packed: Packed) -> None:
    for b in packed.np_batches:
        counts = b["target_count"].astype(int)
        assert counts.sum() == B * PF and counts.min() >= 1 and counts.max() <= K
        assert b["target_pos"].shape == (B, K) and b["segment_seeds"].shape == (B, K)
        for q in range(B):
            n = counts[q]
            pos = np.flatnonzero(b["is_target"][q])
            assert pos.tolist() == b["target_pos"][q][:n].tolist()
            assert (b["segment_seeds"][q][n:] == np.iinfo(np.uint32).max).all()
            seg = b["segment_ids"][q]
            real = b["is_padding"][q] == 0
            assert seg[pos].tolist() == list(range(n))
            assert (seg[~real] == np.iinfo(np.uint16).max).all()
            assert (np.diff(seg[real].astype(int)) >= 0).all(), "segments are contiguous runs"


def test_auto_pack_factor_draws_per_task_seeds_that_fill_the_sequences(packed: Packed) -> None:
    """``pack_factor = 0``: each task draws a fixed number of seeds per step
    (at least B), measured from its mean context size at start-up, and the
    sequences fill better than with one seed per sequence."""

    def run(pf: int) -> list[dict[str, np.ndarray]]:
        s = _native.Sampler(
            packed.db, default_batch_size=B, default_sequence_length=S, pack=True,
            pack_factor=pf, task_pick="round_robin", num_threads=1,
        )
        try:
            return [s.next_train_batch() for _ in range(12)]
        finally:
            s.shutdown()

    auto, one = run(0), run(1)
    per_task: dict[int, set[int]] = {}
    for b in auto:
        per_task.setdefault(int(b["task_idx"].item()), set()).add(int(b["target_count"].sum()))
    assert len(per_task) > 1
    assert all(len(v) == 1 and min(v) >= B for v in per_task.values()), per_task
    assert max(min(v) for v in per_task.values()) > B, "some task packs several seeds per sequence"
    slots = auto[0]["target_pos"].shape[1]
    assert slots == 2 * max(-(-min(v) // B) for v in per_task.values())

    def padding(bs: list[dict[str, np.ndarray]]) -> float:
        return float(np.mean([b["is_padding"].mean() for b in bs]))

    assert padding(auto) < padding(one)


def test_pack_factor_that_cannot_fit_is_a_config_error(packed: Packed) -> None:
    import headwater

    with pytest.raises(headwater.ConfigError, match="pack_factor"):
        _native.Sampler(packed.db, default_sequence_length=8, pack=True, pack_factor=8)


def test_packing_telemetry(packed: Packed) -> None:
    d = packed.drained
    assert 1 <= d["sampler/packing/segments_per_sequence_p50"] <= K
    assert d["sampler/packing/segments_per_sequence_max"] <= K
    assert d["sampler/packing/contexts_cut"] >= 0
    # Each sequence's seeds are counted under the task: B·pack_factor per batch.
    assert sum(v for k, v in d.items() if k.startswith("sampler/tasks/")) == 4 * B * PF


def _perturb_segment(b: dict[str, np.ndarray], q: int, k: int) -> dict[str, np.ndarray]:
    """Batch ``b`` with every input value of segment ``k`` of sequence ``q`` changed."""
    out = {name: v.copy() for name, v in b.items()}
    cells = out["segment_ids"][q] == k
    out["numeric_values"][q, cells] += 3.0
    out["bool_values"][q, cells] ^= 1
    out["timestamp_values"][q, cells] += 0.5
    out["is_null"][q, cells] ^= 1
    return out


def test_perturbing_one_segment_leaves_the_others_bit_identical(packed: Packed) -> None:
    b = next(b for b in packed.np_batches if b["target_count"][0] >= 2)
    other = _perturb_segment(b, 0, 1)
    kw = {
        "text_rows": DV.bucket_size(b["text_batch_embeddings"].shape[0]),
        "fk_rows": DV.bucket_size(b["fk_adj"].shape[1]),
    }
    x, y = DV.batch_to_device(b, **kw), DV.batch_to_device(other, **kw)
    hidden = jax.jit(lambda p, t: M.hidden_states(p, t, packed.col, packed.cat, packed.cfg))
    fwd = jax.jit(lambda p, t: M.forward(p, t, packed.col, packed.cat, packed.cfg))
    hx, hy = np.asarray(hidden(packed.params, x)), np.asarray(hidden(packed.params, y))
    seg = b["segment_ids"][0]
    inside = seg == 1
    assert not np.array_equal(hx[0, inside], hy[0, inside]), "the perturbation must reach its segment"
    np.testing.assert_array_equal(hx[0, ~inside], hy[0, ~inside])
    np.testing.assert_array_equal(hx[1:], hy[1:])
    ox, oy = fwd(packed.params, x), fwd(packed.params, y)
    for name in ox:
        a, c = np.asarray(ox[name]), np.asarray(oy[name])
        keep = np.ones(B * K, bool)
        keep[1] = False  # sequence 0, segment 1
        np.testing.assert_array_equal(a[keep], c[keep], err_msg=name)


def test_loss_counts_only_real_targets(packed: Packed) -> None:
    b = next(b for b in packed.np_batches if b["target_count"][0] >= 2)
    x = DV.batch_to_device(b)
    out = M.forward(packed.params, x, packed.col, packed.cat, packed.cfg)
    full, _ = M.compute_loss(out, x, packed.cfg)
    fewer = {**x, "target_count": x["target_count"].at[0].set(1)}
    part, _ = M.compute_loss(out, fewer, packed.cfg)
    assert float(part) != float(full), "dropping targets must change the mean"
    # Slots past target_count are ignored whatever they point at.
    moved = {**fewer, "target_pos": fewer["target_pos"].at[0, 1:].set(5)}
    again, _ = M.compute_loss(out, moved, packed.cfg)
    assert float(again) == float(part)
    w = np.asarray(M.target_weights(fewer))
    assert w.sum() == B * PF - (int(b["target_count"][0]) - 1)


def test_a_train_step_on_packed_batches_is_finite(packed: Packed) -> None:
    opt = OptConfig(warmup_steps=1, total_steps=4)
    step = M.make_train_step(packed.cfg, opt)
    params, state = packed.params, M.init_opt_state(packed.params, opt)
    for b in packed.np_batches[:2]:
        params, state, metrics = step(params, state, DV.batch_to_device(b), packed.col, packed.cat)
        assert np.isfinite(float(metrics["loss"]))


def test_bench_compares_unpacked_and_packed(packed: Packed) -> None:
    from headwater.bench import format_bench, run_bench

    r = run_bench(
        packed.db, B, S, [1], steps=4, warmup=1, handoff_samples=2, pack_factors=[PF], rounds=1
    )
    pk = r["packing"]
    assert list(pk) == ["unpacked", f"pack_factor={PF}"]
    assert pk["unpacked"]["useful_cells_ratio"] == 1.0
    assert pk[f"pack_factor={PF}"]["padding"] < pk["unpacked"]["padding"]
    assert "useful Mc/s" in format_bench(r) and f"pack_factor={PF}" in format_bench(r)


def test_training_comparison_scores_every_configuration_on_the_same_seeds(
    packed: Packed, tmp_path: Path
) -> None:
    from headwater.bench import format_bench, run_bench
    from headwater.bench.packing import format_train_comparison, train_comparison

    tiny = ["model.d_model=16", "model.num_layers=1", "model.num_heads=2"]
    t = train_comparison(
        str(packed.db), B, S, [PF], steps=4, evals=2, eval_seeds=8, overrides=tiny,
        workdir=tmp_path,
    )
    name = f"pack_factor={PF}"
    assert list(t["configs"]) == ["unpacked", name]
    assert t["conditions"]["model"] == "d_model 16 x 1 layers"
    assert (t["conditions"]["steps"], t["conditions"]["eval_seeds_per_task"]) == (4, 8)
    base, pk = t["configs"]["unpacked"], t["configs"][name]
    assert base["useful_cells_ratio"] == 1.0
    # Both read back a rate and a loss (rates are compared by the bench, not here).
    assert pk["useful_cells_per_s"] > 0 and np.isfinite(pk["final_val_loss"])
    # Capped passes after steps 2 and 4 (the last one too: no final pass),
    # every scored task of the database in both configurations.
    scored = set(t["primary_metric"])
    assert list(base["eval"]) == list(pk["eval"]) == [1, 3]
    assert all(set(pk["eval"][st]) == scored for st in (1, 3))
    good, total = pk["at_least_as_good"]
    assert total == 2 * len(scored) and 0 <= good <= total
    # Both runs' passes scored the same seeds per task (unpacked passes).
    counts = []
    for cfg in ("unpacked", name.replace("=", "-")):
        summary = json.loads((tmp_path / "runs" / f"{cfg}-seed0" / "rank-0.json").read_text())
        counts.append(
            [{k: v for k, v in e.items() if k.endswith("/count")} for e in summary["eval_history"]]
        )
    assert counts[0] == counts[1] and all(v <= 8 for e in counts[0] for v in e.values())
    lines = "\n".join(format_train_comparison(t))
    assert name in lines and "eval >= unpacked" in lines
    with pytest.raises(ValueError, match="needs pack_factors"):
        run_bench(packed.db, B, S, [1], steps=2, train_steps=2)
    with pytest.raises(ValueError, match="must be > 0, got -1, 1"):
        train_comparison(str(packed.db), B, S, [PF], steps=-1)
    with pytest.raises(ValueError, match="one database directory, got /no/such/db"):
        train_comparison("/no/such/db", B, S, [PF], steps=2)
    with pytest.raises(RuntimeError, match=r"unpacked-seed0 failed .*d_model"):
        train_comparison(str(packed.db), B, S, [PF], steps=2, overrides=["model.d_model=-4"])
    assert "training:" not in format_bench(
        run_bench(packed.db, B, S, [1], steps=2, warmup=1, handoff_samples=2)
    )


def test_training_comparison_counts_a_metric_by_its_direction() -> None:
    from headwater.bench.packing import summarize

    def run(mae: float, auroc: float) -> dict[str, Any]:
        return {
            "conditions": {"steps": 2}, "useful_cells_per_s": 10.0, "step_seconds": 1.0,
            "final_val_loss": 1.0, "eval": {1: {"price": mae, "hot": auroc}},
        }

    stypes = {"price": "numerical", "hot": "boolean"}
    # Lower MAE and higher AUROC are better; ties count as at least as good.
    for packed_run, good in [
        (run(0.5, 0.9), [2, 2]), (run(2.0, 0.6), [0, 2]), (run(1.0, 0.8), [2, 2]),
        (run(0.5, 0.6), [1, 2]), (run(2.0, float("nan")), [0, 1]),  # undefined: not compared
    ]:
        t = summarize({"unpacked": [run(1.0, 0.8)], "pack_factor=2": [packed_run]}, stypes)
        assert t["configs"]["pack_factor=2"]["at_least_as_good"] == good
