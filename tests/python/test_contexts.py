"""In-context contexts from Python (docs/contexts.md): the recipe keys on
the ``Sampler``, their telemetry rows in the drain, the config errors, and
``headwater bench --examples`` / ``--sampler-set`` (the Rust tests check the
tier rules and determinism)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import headwater

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
RECIPE = {
    "examples": True,
    "local_context_sizes": [8, 16],
    "bfs_widths": [2, 4],
    "num_walks": 50,
    "walk_length": 4,
    "task_weights": {"event_amount_next": 0.0},
}


def test_examples_fill_contexts_and_report_their_rows() -> None:
    with headwater.Sampler(
        GOLDEN, default_batch_size=4, default_sequence_length=32, num_threads=1, **RECIPE
    ) as s:
        b = s.next_train_batch()
        assert b["is_target"].reshape(4, 32)[:, 0].all(), "the seed's target leads each sequence"
        d = s.drain_step_metrics()
    cells = sum(d[f"sampler/context/tier{t}_cells"] for t in range(3))
    assert cells == int((b["is_padding"] == 0).sum())
    assert d["sampler/context/tier0_cells"] > 0
    assert d["sampler/context/walk_steps"] > 0
    assert d["sampler/context/deadline_hits"] == 0
    assert d["sampler/invariants/temporal_leaks"] == 0


def test_examples_on_a_query_task_is_a_config_error_naming_examples() -> None:
    with pytest.raises(headwater.ConfigError) as ei:
        headwater.Sampler(GOLDEN, examples=True, default_sequence_length=1024)
    assert ei.value.key == "examples" and "event_amount_next" in str(ei.value)


def test_bench_times_the_rtj_recipe_and_sampler_sets() -> None:
    cmd = [sys.executable, "-m", "headwater.cli", "bench", str(GOLDEN), "--batch-size", "4",
           "--seq-len", "256", "--threads", "1", "--steps", "2", "--warmup", "1", "--examples",
           "--sampler-set", "num_walks=100", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    o = out["sampler_overrides"]
    assert o["examples"] is True and o["num_walks"] == 100 and o["walk_length"] == 20
    assert o["local_context_sizes"] == [256] and o["bfs_widths"] == [8, 16, 32, 64, 128, 256]
    assert o["task_weights"] == {"event_amount_next": 0.0}
    assert out["runs"][0]["batches_per_s"] > 0
    bad = subprocess.run([*cmd[:-1], "--sampler-set", "num_walks=-1"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode != 0 and "num_walks" in bad.stderr
