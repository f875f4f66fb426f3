"""Mixed-task batches (``task_mixing = "sequence"``): each
sequence draws its own task by the task weights, the per-sequence ``seq_*``
tensors carry each sequence's target type and categorical window, and the
model's decoder and loss dispatch per target.

Sampler side: both tasks in a batch, shares following the weights,
bit-identical at 1 and 2 threads, on replay and after ``skip``, and the
config errors. Model side: the loss of a mixed batch equals the mean of its
sequences' losses computed one sequence at a time through the one-task
(per-batch) path, and a few train steps on mixed batches stay finite.
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
B, S = 16, 32
#: Two tasks of the small database with different target types.
MIX = {"event_amount": 1.0, "event_kind": 3.0}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Path:
    return build_small_db(tmp_path_factory.mktemp("mixing"), small_data).path


def _cfg() -> dict[str, Any]:
    return {
        "default_batch_size": B,
        "default_sequence_length": S,
        "task_mixing": "sequence",
        "num_threads": 1,
        "telemetry": False,
    }


def _sampler(db: Path, **kw: Any) -> Any:
    return N.Sampler(db, **{**_cfg(), **kw})


def _batches(db: Path, n: int, **kw: Any) -> list[dict[str, np.ndarray]]:
    s = _sampler(db, **kw)
    try:
        return [s.next_train_batch() for _ in range(n)]
    finally:
        s.shutdown()


def _weights(db: Path) -> tuple[list[str], list[float]]:
    s = N.Sampler(db, default_batch_size=2, default_sequence_length=S)
    try:
        names = [t["name"] for t in s.database_metadata()["tasks"]]
    finally:
        s.shutdown()
    return names, [MIX.get(n, 0.0) for n in names]


def test_a_batch_mixes_tasks_by_their_weights(db: Path) -> None:
    names, w = _weights(db)
    got = _batches(db, 40, task_weights=w)
    meta_types = {names.index(n) for n in MIX}
    counts = dict.fromkeys(sorted(meta_types), 0)
    for b in got:
        tasks = b["seq_task_idx"]
        assert set(tasks.tolist()) <= meta_types
        for k in tasks.tolist():
            counts[k] += 1
        # Each sequence's target cell holds its own task's target type.
        pos = b["target_pos"][:, 0].astype(int)
        cell_type = b["semantic_types"][np.arange(B), pos]
        assert (cell_type == b["seq_target_stype"]).all()
    assert sum(len(set(b["seq_task_idx"].tolist())) == 2 for b in got) >= 30, (
        "most batches hold both tasks"
    )
    total = sum(counts.values())
    share = counts[names.index("event_kind")] / total
    # 640 draws at p = 0.75: sd ≈ 0.017.
    assert abs(share - 0.75) < 0.06, (share, counts)
    types = {int(t) for b in got for t in b["seq_target_stype"]}
    assert len(types) == 2, "the two tasks have different target types"


def test_mixed_batches_are_the_same_on_any_thread_count_and_on_replay(db: Path) -> None:
    _, w = _weights(db)
    one = _batches(db, 6, task_weights=w, num_threads=1)
    two = _batches(db, 6, task_weights=w, num_threads=2)
    for a, b in zip(one, two, strict=True):
        assert list(a) == list(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    s = _sampler(db, task_weights=w)
    try:
        again = s.replay_batch(4)
        s.skip(3)
        after_skip = s.next_train_batch()
    finally:
        s.shutdown()
    for k in one[4]:
        np.testing.assert_array_equal(again[k], one[4][k], err_msg=k)
        np.testing.assert_array_equal(after_skip[k], one[3][k], err_msg=k)


def test_resume_continues_a_mixed_stream(db: Path) -> None:
    _, w = _weights(db)
    want = _batches(db, 5, task_weights=w)
    s = _sampler(db, task_weights=w)
    try:
        for _ in range(2):
            s.next_train_batch()
        state = s.state_dict()
    finally:
        s.shutdown()
    r = _sampler(db, task_weights=w)
    try:
        r.load_state_dict(state)
        got = [r.next_train_batch() for _ in range(3)]
    finally:
        r.shutdown()
    for a, b in zip(got, want[2:], strict=True):
        assert a["fingerprint"] == b["fingerprint"]
        np.testing.assert_array_equal(a["seq_task_idx"], b["seq_task_idx"])
    step = _sampler(db, task_weights=w, task_mixing="step")
    try:
        with pytest.raises(headwater.StateError, match="task_mixing"):
            step.load_state_dict(state)
    finally:
        step.shutdown()


def test_step_mixing_is_one_task_per_batch(db: Path) -> None:
    for b in _batches(db, 6, task_mixing="step", task_pick="round_robin"):
        for one in ("task_idx", "target_stype", "cat_emb_start", "cat_emb_count", "db_idx"):
            assert (b[f"seq_{one}"] == b[one][0]).all(), one


def test_task_mixing_errors_name_the_key(db: Path) -> None:
    with pytest.raises(headwater.ConfigError) as e:
        _sampler(db, task_mixing="per_cell")
    assert e.value.key == "task_mixing"
    with pytest.raises(headwater.ConfigError) as e:
        _sampler(db, pack=True, pack_factor=2)
    assert e.value.key == "task_mixing" and "pack" in str(e.value)


def test_task_mix_telemetry_counts_each_sequence_under_its_task(db: Path) -> None:
    _, w = _weights(db)
    for mixing, want in (("sequence", 2.0), ("step", 1.0)):
        s = _sampler(db, task_weights=w, telemetry=True, task_mixing=mixing)
        try:
            got = [s.next_train_batch() for _ in range(3)]
            m = s.drain_step_metrics()
        finally:
            s.shutdown()
        assert all(len(set(b["seq_task_idx"].tolist())) == want for b in got), mixing
        assert m["sampler/context/tasks_per_batch"] == want, mixing
        for name in MIX:
            k = _weights(db)[0].index(name)
            drawn = sum(int((b["seq_task_idx"] == k).sum()) for b in got)
            assert m[f"sampler/tasks/{name}"] == drawn, (mixing, name)


# ----------------------------------------------------------------------------
# The model: per-target decoder dispatch and categorical window
# ----------------------------------------------------------------------------


def _alone(b: dict[str, np.ndarray], q: int) -> dict[str, np.ndarray]:
    """Sequence ``q`` of ``b`` as a one-task batch of one sequence: its own
    task in the per-batch tensors, no per-sequence forms (the pre-mixing
    path of the model)."""
    out: dict[str, np.ndarray] = {}
    for k, v in b.items():
        if k.startswith("seq_") and k != "seq_row_ids":
            continue
        if k in ("text_batch_embeddings",) or v.shape == (1,):
            out[k] = v
        else:
            out[k] = v[q : q + 1]
    for one in ("target_stype", "cat_emb_start", "cat_emb_count"):
        out[one] = b[f"seq_{one}"][q : q + 1].copy()
    return out


def test_loss_of_a_mixed_batch_is_each_sequence_through_its_own_decoder(db: Path) -> None:
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from headwater.model import transformer as M

    names, _ = _weights(db)
    three = {"event_amount": 1.0, "event_kind": 1.0, "user_country": 1.0}
    w = [three.get(n, 0.0) for n in names]
    b = next(x for x in _batches(db, 8, task_weights=w) if len(set(x["seq_task_idx"])) == 3)
    # Two categorical tasks: two windows in one batch.
    assert len(set(b["seq_cat_emb_start"][b["seq_target_stype"] == 3].tolist())) == 2
    cfg, params, col, cat = tiny_model(_sampler(db), 1)
    keys = [*M.MODEL_KEYS]
    whole = {k: jnp.asarray(b[k]) for k in keys}
    loss, _ = M.loss_fn(params, whole, col, cat, cfg)
    per_seq = []
    for q in range(B):
        one = _alone(b, q)
        lq, _ = M.loss_fn(params, {k: jnp.asarray(v) for k, v in one.items()}, col, cat, cfg)
        per_seq.append(float(lq))
    np.testing.assert_allclose(float(loss), np.mean(per_seq), rtol=2e-5)
    # The per-batch form alone (sequence 0's task for all) is not it.
    wrong = {**whole}
    for one in ("target_stype", "cat_emb_start", "cat_emb_count"):
        wrong[f"seq_{one}"] = jnp.broadcast_to(whole[f"seq_{one}"][0], (B,))
    bad, _ = M.loss_fn(params, wrong, col, cat, cfg)
    assert abs(float(bad) - float(loss)) > 1e-3


def test_a_few_train_steps_on_mixed_batches_stay_finite(db: Path) -> None:
    """Mixed tasks and masked cells together, through the jitted train step."""
    pytest.importorskip("optax")
    import jax

    from headwater.model import device as DV
    from headwater.model import transformer as M
    from headwater.model.optim import OptConfig

    _, w = _weights(db)
    raw = _batches(db, 4, task_weights=w, mask_prob_max=0.3)
    assert all(b["mask_count"].any() for b in raw)
    s = _sampler(db)
    try:
        col, cat = DV.tables_to_device(s.column_embeddings(), s.categorical_embeddings())
        meta = s.database_metadata()
    finally:
        s.shutdown()
    cfg = M.ModelConfig(max_categories=M.max_categories(meta), num_layers=1, d_model=32)
    opt = OptConfig(warmup_steps=1, total_steps=4)
    text_rows = max(DV.bucket_size(b["text_batch_embeddings"].shape[0]) for b in raw)
    fk_rows = max(DV.bucket_size(b["fk_adj"].shape[1]) for b in raw)
    params = M.init_params(jax.random.key(0), cfg, int(col.shape[1]))
    state = M.init_opt_state(params, opt)
    step = M.make_train_step(cfg, opt)
    for b in raw:
        dev = DV.batch_to_device(b, text_rows=text_rows, fk_rows=fk_rows)
        params, state, metrics = step(params, state, dev, col, cat)
        assert np.isfinite(float(metrics["loss"])), metrics


def test_a_mixed_batch_spans_the_databases_of_a_mixture(db: Path) -> None:
    names, w = _weights(db)
    both = w + w  # the mixture's tasks: the first copy's, then the second's
    got = []
    for threads in (1, 2):
        s = N.Sampler([db, db], **{**_cfg(), "task_weights": both, "num_threads": threads})
        try:
            got.append([s.next_train_batch() for _ in range(4)])
        finally:
            s.shutdown()
    for b in got[0]:
        dbs = b["seq_db_idx"]
        assert set(dbs.tolist()) == {0, 1}
        np.testing.assert_array_equal(dbs, (b["seq_task_idx"] >= len(names)).astype(np.uint32))
        text = (b["semantic_types"] == 4) & (b["is_null"] == 0) & (b["is_padding"] == 0)
        assert b["text_embed_ids"][text].max() < b["text_batch_embeddings"].shape[0]
    for a, b in zip(*got, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_a_mixed_batch_counts_each_seed_under_its_own_database(db: Path) -> None:
    """The per-database seed counters of a mixture count each sequence of a
    mixed-database batch under its own database (not the first sequence's),
    and ``other_seeds`` the sequences of databases without a series."""
    _, w = _weights(db)
    for top, reported in ((2, (0, 1)), (1, None)):
        s = N.Sampler([db, db], **{**_cfg(), "task_weights": w + w, "telemetry": True,
                                   "telemetry_top_databases": top})
        try:
            got = [s.next_train_batch() for _ in range(4)]
            m = s.drain_step_metrics()
        finally:
            s.shutdown()
        per_db = [sum(int((b["seq_db_idx"] == d).sum()) for b in got) for d in (0, 1)]
        assert min(per_db) > 0, per_db
        series = sorted((k, v) for k, v in m.items()
                        if k.startswith("sampler/databases/") and k.endswith("/seeds"))
        if reported:
            # The mixture names the second copy `db#2`.
            names = [f"sampler/databases/{n}/seeds" for n in (db.name, f"{db.name}#2")]
            assert dict(series) == {names[d]: per_db[d] for d in reported}, (series, per_db)
            assert m["sampler/databases/other_seeds"] == 0
        else:
            assert len(series) == 1, series
            assert series[0][1] + m["sampler/databases/other_seeds"] == sum(per_db), (series, m)
            assert series[0][1] in per_db and series[0][1] != sum(per_db), (series, per_db)


def test_mixing_and_masking_follow_a_variable_sequence_length(db: Path) -> None:
    """With ``sequence_lengths`` each step has its own ``S`` and ``B =
    tokens / S``: a mixed step draws ``B`` task slots per rank, and masking
    has ``ceil(mask_prob_max · S)`` slots at that step's ``S``."""
    _, w = _weights(db)
    kw = {"task_weights": w, "sequence_lengths": [32, 64], "tokens_per_batch": 512}
    got = []
    for threads in (1, 2):
        s = N.Sampler(db, **{**_cfg(), **kw, "mask_prob_max": 0.5, "num_threads": threads})
        try:
            got.append([s.next_train_batch() for _ in range(6)])
        finally:
            s.shutdown()
    shapes = {b["semantic_types"].shape for b in got[0]}
    assert shapes == {(16, 32), (8, 64)}, shapes
    for b in got[0]:
        n, s = b["semantic_types"].shape
        assert b["seq_task_idx"].shape == (n,) and b["mask_pos"].shape == (n, (s + 1) // 2)
    for a, b in zip(*got, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
