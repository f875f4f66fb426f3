"""The main job's final evaluation (README command 1 runs ``headwater train``
on the TPC-H database): a short run on the session's TPC-H database scores
val and test on the first ``eval_final_max_seeds`` seeds of every task and
reports, per task, the model's metrics beside the best constant's."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Tpch, child_env, tiny_train_config

from headwater.evaluation.scoring import METRICS

pytest.importorskip("jax")
pytest.importorskip("optax")

TASKS = {
    "order_priority": "categorical",
    "order_status": "categorical",
    "part_retail_price": "numerical",
    "order_num_lineitems": "numerical",
    "customer_repeat_order_90d": "boolean",
}


def test_short_run_reports_model_and_baseline_per_task_on_capped_passes(
    tmp_path: Path, tpch: Tpch
) -> None:
    cap = 8
    cfg = tmp_path / "main.toml"
    cfg.write_text(
        # 6 steps, as test_train's one-process verdict run: the same
        # compiled train step, loaded from the session's cache there.
        tiny_train_config(
            tpch.built.path,
            6,
            train=f"val_every = 0\ncheckpoint_every = 0\neval_final_max_seeds = {cap}",
        ).replace("prometheus_port = 0", 'prometheus_port = 0\nwandb_mode = "disabled"'),
        encoding="utf-8",
    )
    args = ["train", str(cfg), "--dir", str(tmp_path), "--run-name", "main"]
    r = subprocess.run(
        [sys.executable, "-m", "headwater.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(tmp_path),
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "main" / "rank-0.json").read_text())
    assert s["eval_max_seeds"] == cap
    assert sorted(s["eval"]) == ["test", "val"]
    for split, tasks in s["eval"].items():
        assert {t: v["stype"] for t, v in tasks.items()} == TASKS, split
        for task, v in tasks.items():
            # The first `cap` seeds of the task, padding and null targets left out.
            assert 0 < v["count"] <= cap, (split, task)
            assert list(v["metrics"]) == list(v["baseline"]) == list(METRICS[v["stype"]])
            primary = next(iter(METRICS[v["stype"]]))
            assert math.isfinite(v["metrics"][primary]), (split, task)
    # The printed table: one line per split, task and metric, model beside baseline.
    assert f"evaluation (the first {cap} seeds of each task, " in r.stdout, r.stdout[-3000:]
    table = r.stdout.split("evaluation (", 1)[1].splitlines()[1:]
    shown = {
        (x.split()[0], x.split()[1], x.split()[2])
        for x in table
        if x.split()[:1] in (["val"], ["test"])
    }
    for split in ("val", "test"):
        for task, stype in TASKS.items():
            for m in METRICS[stype]:
                assert (split, task, m) in shown, (split, task, m)
    assert s["eval_seconds"] > 0 and "s evaluation on 1 process" in r.stdout
