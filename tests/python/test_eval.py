"""Evaluation passes and per-task metrics.

The pass itself (seed coverage over ranks for any world size, padding,
determinism, the training stream untouched) is also checked in Rust
(``tests/integration/eval.rs``); here: the Python API, the metric
definitions against scikit-learn and RelBench's own metric module, and a
two-process run whose metrics are computed on the union of the ranks'
predictions, beat the trivial baseline on a learnable task, log each pass's
sampler telemetry, and are reproduced by ``headwater eval`` from the final
checkpoint; ``headwater eval`` on a one-process run's checkpoints and its
refusals (no checkpoint, a missing step, another model config, another
database).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SmallDb, build_db_from_sql, child_env, read_wandb_run, relbench_metrics_module

import headwater
from headwater.evaluation.scoring import METRICS, baseline, score

SAMPLER = {"default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: Any) -> SmallDb:
    from conftest import build_small_db

    return build_small_db(tmp_path_factory.mktemp("eval_small"), small_data)


# ----------------------------------------------------------------------------
# The pass
# ----------------------------------------------------------------------------


def test_a_pass_yields_each_task_once_and_pads_only_the_last_batch(small: SmallDb) -> None:
    b = SAMPLER["default_batch_size"]
    with headwater.Sampler(small.path, **SAMPLER) as s:
        pass_ = s.eval_batches("val")
        tasks = pass_.tasks()
        assert len(pass_) == sum(t["batches"] for t in tasks)
        batches = list(pass_)
        assert len(batches) == len(pass_)
        assert any(t["seeds"] % b for t in tasks), "the fixture must have a partial last batch"
        names = [t["task"] for t in tasks]
        at = 0
        for t in tasks:
            mine = batches[at : at + t["batches"]]
            at += t["batches"]
            assert {int(x["task_idx"][0]) for x in mine} == {names.index(t["task"])}
            valid = np.concatenate([x["seq_valid"] for x in mine])
            assert valid.dtype == np.uint8 and valid.shape == (t["batches"] * b,)
            # Every seed once: exactly `seeds` valid sequences, all before the padding.
            assert int(valid.sum()) == t["seeds"] == t["rank_seeds"]
            assert np.all(valid[: t["seeds"]] == 1) and np.all(valid[t["seeds"] :] == 0)
            for x in mine[:-1]:
                assert np.all(x["seq_valid"] == 1), "only a task's last batch is padded"
        again = [x["fingerprint"][0] for x in s.eval_batches("val")]
        assert again == [x["fingerprint"][0] for x in batches], "a pass is deterministic"
        capped = s.eval_batches("val", task=names[0], max_seeds=3).tasks()
        assert capped == [{"task": names[0], "seeds": 3, "rank_seeds": 3, "batches": 1}]
        for bad, key in (
            ({"split": "train"}, "split"),
            ({"task": "nope"}, "task"),
            ({"max_seeds": 0}, "max_seeds"),
        ):
            with pytest.raises(ValueError, match=f"`{key}`"):
                s.eval_batches(**{"split": "val", **bad})


def test_interleaved_evaluation_leaves_the_training_stream_unchanged(small: SmallDb) -> None:
    def prints(s: Any, n: int) -> list[int]:
        return [int(s.next_train_batch()["fingerprint"][0]) for _ in range(n)]

    with headwater.Sampler(small.path, **SAMPLER) as s:
        alone = prints(s, 8)
    with headwater.Sampler(small.path, **SAMPLER) as s:
        mixed = prints(s, 3)
        n_val = sum(1 for _ in s.eval_batches("val"))
        mixed += prints(s, 2)
        n_test = sum(1 for _ in s.eval_batches("test", max_seeds=5))
        mixed += prints(s, 3)
    assert n_val > 0 and n_test > 0
    assert mixed == alone


def test_two_ranks_cover_the_split_once_between_them(small: SmallDb) -> None:
    with headwater.Sampler(small.path, **SAMPLER) as whole:
        want = {t["task"]: t["seeds"] for t in whole.eval_batches("test").tasks()}
    got: dict[str, int] = dict.fromkeys(want, 0)
    lens = []
    for rank in (0, 1):
        with headwater.Sampler(small.path, rank=rank, world_size=2, **SAMPLER) as s:
            p = s.eval_batches("test")
            lens.append([t["batches"] for t in p.tasks()])
            for t in p.tasks():
                assert t["seeds"] == want[t["task"]]
                assert t["rank_seeds"] == (t["seeds"] + 1 - rank) // 2
                got[t["task"]] += t["rank_seeds"]
            assert sum(int(x["seq_valid"].sum()) for x in p) == sum(
                t["rank_seeds"] for t in p.tasks()
            )
    assert got == want
    assert lens[0] == lens[1], "every rank yields the same batches (collectives line up)"


# ----------------------------------------------------------------------------
# Metric definitions
# ----------------------------------------------------------------------------


def test_metrics_equal_scikit_learn_and_relbench_on_the_same_arrays() -> None:
    import sklearn.metrics as skm

    rng = np.random.default_rng(3)
    y = rng.normal(10, 3, 200)
    p = y + rng.normal(0, 1, 200)
    got = score("numerical", y, p)
    assert got == {
        "mae": pytest.approx(skm.mean_absolute_error(y, p)),
        "rmse": pytest.approx(math.sqrt(skm.mean_squared_error(y, p))),
        "r2": pytest.approx(skm.r2_score(y, p)),
    }
    rb = relbench_metrics_module()
    std = float(np.std(y, ddof=1))
    assert got["mae"] / std == pytest.approx(rb.make_nmae(lambda: std)(y, p))
    yb = (rng.random(300) < 0.3).astype(float)
    pb = np.clip(yb * 0.4 + rng.random(300) * 0.6, 0, 1)
    got = score("boolean", yb, pb)
    assert got["auroc"] == pytest.approx(rb.roc_auc(yb, pb))
    assert got["average_precision"] == pytest.approx(skm.average_precision_score(yb, pb))
    assert got["accuracy"] == pytest.approx(np.mean((pb >= 0.5) == yb))
    yc = rng.integers(0, 5, 150)
    pc = np.where(rng.random(150) < 0.6, yc, rng.integers(0, 5, 150))
    got = score("categorical", yc, pc)
    assert got["accuracy"] == pytest.approx(np.mean(yc == pc))
    assert got["macro_f1"] == pytest.approx(skm.f1_score(yc, pc, average="macro"))
    # By hand, so the definitions are pinned beyond "the same library".
    assert score("numerical", [1, 2, 3], [2, 2, 2])["mae"] == pytest.approx(2 / 3)
    assert score("boolean", [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])["auroc"] == pytest.approx(0.75)
    assert score("categorical", [0, 0, 1, 2], [0, 1, 1, 2])["macro_f1"] == pytest.approx(
        (2 / 3 + 2 / 3 + 1) / 3
    )


def test_undefined_metrics_are_nan_and_the_baseline_is_the_best_constant() -> None:
    one_class = score("boolean", [1, 1, 1], [0.2, 0.9, 0.5])
    assert math.isnan(one_class["auroc"]) and one_class["accuracy"] == pytest.approx(2 / 3)
    assert all(math.isnan(v) for v in score("numerical", [], []).values())
    assert math.isnan(score("numerical", [2, 2], [1, 3])["r2"])
    base = baseline("numerical", [1.0, 2.0, 6.0])
    assert base["mae"] == pytest.approx((2 + 1 + 3) / 3) and base["r2"] == 0.0
    assert baseline("categorical", [4, 4, 1])["accuracy"] == pytest.approx(2 / 3)
    assert baseline("boolean", [1, 0, 0, 0])["auroc"] == 0.5
    assert set(score("timestamp", [0.0, 1.0], [0.5, 0.5])) == set(METRICS["timestamp"])
    with pytest.raises(ValueError, match="3 values but y_pred has 2"):
        score("numerical", [1, 2, 3], [1, 2])


# ----------------------------------------------------------------------------
# A learnable task, two ranks, then `headwater eval`
# ----------------------------------------------------------------------------

LEARNABLE_SCHEMA = """
[[tasks]]
name = "price_copy"
anchor_table = "items"
target_stype = "numerical"
query = "SELECT item_id, NULL, price FROM items"

[[tasks]]
name = "hot_copy"
anchor_table = "items"
target_stype = "boolean"
query = "SELECT item_id, NULL, hot FROM items"
"""


def _learnable_db(root: Path) -> Path:
    """Items whose task targets copy a visible cell of the seed row: a model
    that reads its input beats any constant."""
    sql = [
        "CREATE TABLE items (item_id INTEGER PRIMARY KEY, price DOUBLE, hot BOOLEAN)",
        "INSERT INTO items SELECT i, (i * 37) % 101, (i * 37) % 101 > 50 FROM range(600) t(i)",
    ]
    return build_db_from_sql(root, "learn", sql, LEARNABLE_SCHEMA, ["price_copy", "hot_copy"])


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "headwater.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(tmp_path),
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
    return r


def test_two_rank_run_scores_the_union_beats_the_baseline_and_eval_reproduces_it(
    tmp_path: Path,
) -> None:
    db = _learnable_db(tmp_path)
    cfg = tmp_path / "learn.toml"
    cfg.write_text(
        f"""
[database]
path = "{db}"
[sampler]
default_batch_size = 8
default_sequence_length = 16
num_threads = 1
[model]
d_model = 32
num_layers = 1
num_heads = 2
[train]
steps = 100
val_every = 0
val_batches = 0
eval_every = 50
eval_max_seeds = 16
log_every = 50
warmup_steps = 1
[logging]
prometheus_port = 0
""",
        encoding="utf-8",
    )
    out = _run(
        tmp_path,
        "train",
        str(cfg),
        "--dir",
        str(tmp_path / "runs"),
        "--run-name",
        "learn",
        "--num-processes",
        "2",
    )
    run_dir = tmp_path / "runs" / "learn"
    s0, s1 = (json.loads((run_dir / f"rank-{r}.json").read_text()) for r in (0, 1))
    # Both ranks scored the union of the gathered predictions: the same numbers.
    assert s0["eval"] == s1["eval"]
    with headwater.Sampler(db, **{**SAMPLER, "default_batch_size": 8}) as s:
        for split in ("val", "test"):
            want = {t["task"]: t["seeds"] for t in s.eval_batches(split).tasks()}
            assert {k: v["count"] for k, v in s0["eval"][split].items()} == want
    val = s0["eval"]["val"]
    assert val["price_copy"]["metrics"]["mae"] < 0.8 * val["price_copy"]["baseline"]["mae"]
    assert val["hot_copy"]["metrics"]["auroc"] > 0.9 > val["hot_copy"]["baseline"]["auroc"]
    # The capped periodic pass: eval_max_seeds seeds per task, at step 50.
    capped = [e for e in s0["eval_history"] if e["step"] == 49]
    assert [e["split"] for e in capped] == ["val"]
    assert capped[0]["eval/val/price_copy/count"] == 16
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/val/hot_copy/auroc" in r] == [49, 99]
    assert "evaluation (the first 256 seeds of each task" in out.stdout, out.stdout[-3000:]
    assert "price_copy" in out.stdout
    wb = read_wandb_run(Path(s0["wandb_dir"]), child_env(tmp_path))
    logged = [r for r in wb["history"] if "eval/val/price_copy/mae" in r]
    assert [r["trainer/step"] for r in logged] == [49, 99]
    assert logged[-1]["eval/val/price_copy/mae"] == pytest.approx(
        val["price_copy"]["metrics"]["mae"]
    )
    assert wb["metrics"]["eval/val/price_copy/mae"]["summary"] == ["last", "min"]
    assert wb["metrics"]["eval/test/hot_copy/auroc"]["summary"] == ["last", "max"]
    # Each pass's sampler telemetry, reduced over the two ranks: exactly its
    # batches (both ranks yield the same number) and seeds per task.
    for e in s0["eval_history"]:
        split, b = e["split"], 8
        with headwater.Sampler(db, **{**SAMPLER, "default_batch_size": b}) as s:
            cap = 16 if e["step"] == 49 and split == "val" else None
            p = s.eval_batches(split, max_seeds=cap)
            per_rank = {t["task"]: math.ceil(math.ceil(t["seeds"] / 2) / b) for t in p.tasks()}
        assert e[f"eval/{split}/sampler/batches"] == 2 * sum(per_rank.values()), e
        for task, n in per_rank.items():
            assert e[f"eval/{split}/sampler/tasks/{task}"] == 2 * n * b, (e, task)
        assert e[f"eval/{split}/sampler/invariants/temporal_leaks"] == 0
    # `headwater eval` on the final checkpoint, one process: the same metrics.
    ev = _run(tmp_path, "eval", str(run_dir), "--split", "both")
    assert "hot_copy" in ev.stdout
    # It names the checkpoint whose parameters it scores, shows each pass's
    # progress, and restores no sampler stream (it only checks the state).
    last = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert f"restored the parameters of checkpoint {last} " in ev.stdout, ev.stdout[-2000:]
    assert re.search(r"eval test: (\d+)/\1 batches \(100%\)", ev.stdout), ev.stdout[-2000:]
    assert "resumed from a saved sampler state" not in ev.stdout + ev.stderr
    for split in ("val", "test"):
        again = json.loads((run_dir / f"eval-{split}.json").read_text())
        for task, r in s0["eval"][split].items():
            assert again[task]["count"] == r["count"]
            for m, v in r["metrics"].items():
                assert again[task]["metrics"][m] == pytest.approx(v, rel=1e-3, abs=1e-4), (
                    split,
                    task,
                    m,
                )


def test_eval_scores_the_chosen_checkpoint_and_refuses_what_does_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from headwater.errors import ConfigError
    from headwater.evaluation.eval_run import evaluate_run

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    db = _learnable_db(tmp_path)
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(
        f'''[database]
path = "{db}"
[sampler]
default_batch_size = 8
default_sequence_length = 16
num_threads = 1
[model]
d_model = 16
num_layers = 1
num_heads = 2
[train]
steps = 4
checkpoint_every = 2
val_batches = 2
warmup_steps = 0
[logging]
prometheus_port = 0
wandb_mode = "disabled"
''',
        encoding="utf-8",
    )
    _run(tmp_path, "train", str(cfg), "--dir", str(tmp_path / "runs"), "--run-name", "r")
    run_dir = tmp_path / "runs" / "r"
    summary = json.loads((run_dir / "rank-0.json").read_text())
    final = summary["eval"]["val"]
    # The final validation drew 2 val-stream batches just before the val pass:
    # the pass's logged telemetry counts the pass alone.
    with headwater.Sampler(db, **{**SAMPLER, "default_batch_size": 8}) as s:
        n_val = len(s.eval_batches("val"))
    (row,) = [e for e in summary["eval_history"] if e["split"] == "val"]
    assert row["eval/val/sampler/batches"] == n_val
    # The latest checkpoint (4) holds the parameters the run's own final pass scored.
    step, got = evaluate_run(run_dir, ("val",))
    assert step == 4
    for task, r in final.items():
        assert got["val"][task]["count"] == r["count"]
        for m, v in r["metrics"].items():
            assert got["val"][task]["metrics"][m] == pytest.approx(v, rel=1e-3, abs=1e-4)
    # --step 2: the earlier parameters, so other predictions on the same rows.
    step, early = evaluate_run(run_dir, ("val",), step=2)
    assert step == 2
    assert early["val"]["price_copy"]["count"] == final["price_copy"]["count"]
    assert early["val"]["price_copy"]["metrics"] != got["val"]["price_copy"]["metrics"]

    with pytest.raises(ConfigError, match=r"no committed checkpoint 3; committed: 2, 4"):
        evaluate_run(run_dir, ("val",), step=3)
    empty = tmp_path / "runs" / "empty"
    empty.mkdir()
    (empty / "launch.json").write_text((run_dir / "launch.json").read_text())
    with pytest.raises(ConfigError, match=r"no committed checkpoint under .*checkpoints"):
        evaluate_run(empty, ("val",))
    with pytest.raises(ConfigError, match=r"not a headwater train run directory"):
        evaluate_run(tmp_path, ("val",))
    # The run's config now names another model: refused, naming the key.
    launch = json.loads((run_dir / "launch.json").read_text())
    changed = {**launch, "overrides": {**launch["overrides"], "model.d_model": 32}}
    (run_dir / "launch.json").write_text(json.dumps(changed))
    with pytest.raises(ConfigError, match=r"`model.d_model`: 16 in the checkpoint, 32 now"):
        evaluate_run(run_dir, ("val",))
    (run_dir / "launch.json").write_text(json.dumps(launch))
    # Another database at the same path: refused by its content hash.
    other = tmp_path / "other"
    other.mkdir()
    sql = [
        "CREATE TABLE items (item_id INTEGER PRIMARY KEY, price DOUBLE, hot BOOLEAN)",
        "INSERT INTO items SELECT i, (i * 13) % 101, i % 2 = 0 FROM range(500) t(i)",
    ]
    rebuilt = build_db_from_sql(other, "learn", sql, LEARNABLE_SCHEMA, ["price_copy", "hot_copy"])
    shutil.rmtree(db)
    shutil.move(rebuilt, db)
    with pytest.raises(ConfigError, match=r"checkpoint 4 does not fit the database"):
        evaluate_run(run_dir, ("val",))
    assert not (run_dir / "eval-test.json").exists()


# ----------------------------------------------------------------------------
# A RelBench task: trained and scored on exactly its own split files' rows
# ----------------------------------------------------------------------------

SCORE_TASK = "user-score"


def _add_regression_task(root: Path) -> dict[str, list[tuple[int, dt.datetime, float]]]:
    """A second RelBench task (regression) whose every label is distinct and
    names its file: ``1000 · (0 train, 1 val, 2 test) + i``, so a seed's
    label says which row of which file it is. Returns each file's rows
    ``(user_id, timestamp, score)`` whose user exists."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import BASE_TIME, N_USERS, relbench_manifest_module

    rb = relbench_manifest_module()
    tdir = root / "tasks" / SCORE_TASK
    rb.TaskManifest(
        name=SCORE_TASK,
        kind="forecast",
        task_type="regression",
        description="a score per user",
        entity_table="users",
        entity_col="user_id",
        target_col="score",
        time_col="timestamp",
        timedelta="30 days",
        remove_columns=[],
        sql="SELECT timestamp, user_id, 0.0 AS score FROM timestamps, users",
    ).save(tdir / "manifest.yaml")
    files = {}
    # val is as large as train: no hash split at the ratios used gives that.
    for code, (split, n) in enumerate((("train", 9), ("val", 9), ("test", 7))):
        times = [BASE_TIME + dt.timedelta(days=40 + code * 10 + i) for i in range(n)]
        uids = [1 + (i * 5 + code) % N_USERS for i in range(n)]
        if split == "test":
            uids[-1] = 12345  # names no user: not a seed
        scores = [1000.0 * code + i for i in range(n)]
        t = pa.table(
            {
                "timestamp": pa.array(times, pa.timestamp("ns")),
                "user_id": pa.array(uids, pa.int64()),
                "score": pa.array(scores, pa.float64()),
            }
        )
        pq.write_table(t, tdir / f"{split}.parquet")
        files[split] = [r for r in zip(uids, times, scores, strict=True) if r[0] != 12345]
    return files


def test_relbench_task_uses_its_own_split_files(tmp_path: Path, make_relbench: Any, small_data: Any) -> None:
    """Each seed of a RelBench task keeps the split of the label file it came
    from: the val/test passes yield exactly that file's rows (their distinct
    labels, anchor rows and timestamps), each once, and the train stream draws
    only train-file rows — whatever the split ratios say."""
    from conftest import RELBENCH_TASK

    src = make_relbench(tmp_path / "relbench")
    files = _add_regression_task(src)
    headwater.preprocess(src, tmp_path / "db", embedder="hash", progress=False)
    db = headwater.Database(tmp_path / "db")
    meta = json.loads(db.metadata_json())
    task = next(t for t in meta["tasks"] if t["name"] == SCORE_TASK)
    assert task["stored_splits"] is True
    k = task["idx"]
    arr = db.task_arrays(k)
    users = next(t for t in meta["tables"] if t["name"] == "users")
    uids = small_data.values("users", "user_id")
    stats = meta["columns"][task["target_column"]]["stats"]
    std, mean = stats["std"], stats["mean"]
    # The stored seeds (targets z-scored): label → (anchor row, obs time µs).
    seeds = {
        round(float(y) * std + mean): (int(r), int(t))
        for r, t, y in zip(arr["anchor_row"], arr["obs_time"], arr["target"], strict=True)
    }
    epoch = dt.datetime(1970, 1, 1)
    for split, rows in files.items():
        for u, ts, y in rows:
            want = (users["row_offset"] + uids.index(u), (ts - epoch) // dt.timedelta(microseconds=1))
            assert seeds.pop(round(y)) == want, (split, y)
    assert not seeds, "every seed is a label file's row"

    def labels(batch: dict[str, Any], only_valid: bool) -> list[int]:
        assert int(batch["task_idx"][0]) == k
        assert np.all(batch["is_target"][:, 0] == 1), "the target is at position 0"
        z = batch["numeric_values"][:, 0].astype(np.float64)
        keep = batch["seq_valid"] == 1 if only_valid else np.ones(len(z), bool)
        return [round(v) for v in (z * std + mean)[keep]]

    # Ratios that would put almost everything in train under the hash rule.
    kw = {**SAMPLER, "split_ratios": (0.98, 0.01, 0.01), "split_seed": 3,
          "task_weights": {SCORE_TASK: 1.0, RELBENCH_TASK: 0.0}}
    with headwater.Sampler(tmp_path / "db", **kw) as s:
        for split in ("val", "test"):
            p = s.eval_batches(split, task=SCORE_TASK)
            assert [t["seeds"] for t in p.tasks()] == [len(files[split])]
            got = [y for b in p for y in labels(b, only_valid=True)]
            assert sorted(got) == sorted(round(y) for _, _, y in files[split]), split
            assert len(set(got)) == len(got), "each row once"
        drawn = [y for _ in range(12) for y in labels(s.next_train_batch(), only_valid=False)]
        train = {round(y) for _, _, y in files["train"]}
        assert set(drawn) == train, "the train stream draws exactly the train file's rows"
        val = [y for _ in range(6) for y in labels(s.next_val_batch(), only_valid=False)]
        assert set(val) == {round(y) for _, _, y in files["val"]}


def test_relbench_forecast_task_is_scored_on_its_labelled_rows_beside_a_baseline(
    tmp_path: Path, make_relbench: Any, small_data: Any
) -> None:
    """A RelBench folder with a forecast task: each split's pass scores exactly
    the labelled rows of that split's label file (those whose entity exists),
    no padding, no other row, whatever the split ratios; the metrics come with
    the constant baseline, equal to scikit-learn's on the file's labels."""
    pytest.importorskip("jax")
    import pyarrow.parquet as pq
    from conftest import RELBENCH_TASK
    from sklearn.metrics import accuracy_score, average_precision_score

    from headwater.cluster.mesh import Mesh
    from headwater.evaluation.evaluate import Evaluator, score_predictions
    from headwater.evaluation.padder import Padder
    from headwater.model import transformer as M
    from headwater.model.device import tables_to_device

    src = make_relbench(tmp_path / "relbench")
    headwater.preprocess(src, tmp_path / "db", embedder="hash", progress=False)
    db = headwater.Database(tmp_path / "db")
    meta = json.loads(db.metadata_json())
    k = next(t["idx"] for t in meta["tasks"] if t["name"] == RELBENCH_TASK)
    arrays = db.task_arrays(k)
    # The task's seeds are the label files' rows (train, val, test in order)
    # whose entity exists, with their labels.
    labels = [
        int(c)
        for s in ("train", "val", "test")
        for u, c in zip(
            small_data.labels[s]["user_id"].to_pylist(),
            small_data.labels[s]["churn"].to_pylist(),
            strict=True,
        )
        if u != 12345
    ]
    assert np.asarray(arrays["target"]).astype(int).tolist() == labels
    kw = {**SAMPLER, "split_ratios": (0.5, 0.25, 0.25), "split_seed": 0}
    cfg = M.ModelConfig(d_model=16, num_layers=1, num_heads=2, max_categories=8)
    with headwater.Sampler(tmp_path / "db", **kw) as s:
        col, cat = s.column_embeddings(), s.categorical_embeddings()
        mesh = Mesh()
        ev = Evaluator(s, mesh, Padder(mesh, 8), cfg, mesh.replicate(tables_to_device(col, cat)))
        params = mesh.replicate(M.init_params(0, cfg, int(col.shape[1])))
        for split in ("val", "test"):
            # The split file's labels, read independently of headwater.
            t = pq.read_table(src / "tasks" / RELBENCH_TASK / f"{split}.parquet")
            want = np.array(
                [
                    int(c)
                    for u, c in zip(t["user_id"].to_pylist(), t["churn"].to_pylist(), strict=True)
                    if u != 12345
                ]
            )
            preds = ev.predictions(params, split)
            got = preds[RELBENCH_TASK]["y_true"].astype(int)
            assert sorted(got.tolist()) == sorted(want.tolist()), split
            r = score_predictions(preds)[RELBENCH_TASK]
            assert r["count"] == len(want) > 0
            assert set(r["metrics"]) == set(r["baseline"]) == set(METRICS["boolean"])
            rate = np.full(len(want), want.mean())
            assert r["baseline"]["accuracy"] == pytest.approx(accuracy_score(want, rate >= 0.5))
            if 0 < want.sum() < len(want):
                assert r["baseline"]["auroc"] == 0.5
                assert r["baseline"]["average_precision"] == pytest.approx(
                    average_precision_score(want, rate)
                )
