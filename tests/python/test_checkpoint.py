"""Training checkpoints and ``headwater train --resume``: real runs.

Every run is the real command in a subprocess (two processes on one
loopback ``jax.distributed`` job) on the session's TPC-H database, with the
tiny model of ``test_train.py``:

* a run killed with SIGKILL (the whole process group, W&B's writer
  included) at a step after a checkpoint and resumed ends with the same
  parameters (digest) as an uninterrupted run of the same length; the
  combined W&B offline files and ``metrics.jsonl`` hold each step once, with
  the uninterrupted run's losses (no seam);
* SIGTERM to the launcher: both ranks stop after the same step, checkpoint
  it, write their summaries, and the exact resume command is printed; that
  command continues on another number of processes, is stopped again during
  the final evaluation (the last checkpoint precedes it), and resumed once
  more reruns only the final passes (once each in ``metrics.jsonl``);
* a resume under a changed stream key or model key, or a new run into a
  directory with checkpoints, is refused naming what differs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import READ_WANDB, Tpch, child_env, tiny_train_config

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("wandb")
pytest.importorskip("orbax.checkpoint")

STEPS = 12
EVERY = 4


def config(db: Path, steps: int = STEPS, every: int = EVERY) -> str:
    return tiny_train_config(db, steps, train=f"val_every = 5\ncheckpoint_every = {every}")


def command(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "headwater.cli", "train", *args]


def run(tmp_path: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(tmp_path, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(tmp_path),
        check=False,
    )


def start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(tmp_path, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(tmp_path),
        start_new_session=True,
    )


def rows(run_dir: Path, key: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if key in r]


def trainer_steps_logged(run_dir: Path) -> int:
    """The last step with a trainer row in ``metrics.jsonl`` (-1: none yet)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return -1
    steps = [-1]
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            break
        if "trainer/loss" in r:
            steps.append(r["step"])
    return max(steps)


def committed(run_dir: Path) -> list[int]:
    d = run_dir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def wait_until(proc: subprocess.Popen[str], cond: Any, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the run ended (status {proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def wandb_history(tmp_path: Path, run_dir: Path) -> tuple[list[dict[str, Any]], set[str]]:
    """Every history row of every ``.wandb`` file of the run (file order)."""
    files = sorted(f for f in run_dir.glob("wandb/*/run-*.wandb") if not f.parent.is_symlink())
    hist: list[dict[str, Any]] = []
    for f in files:
        read = subprocess.run(
            [sys.executable, str(READ_WANDB), str(f)],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(tmp_path),
            check=False,
        )
        assert read.returncode == 0, read.stderr[-3000:]
        hist += json.loads(read.stdout)["history"]
    return hist, {f.name for f in files}


def summaries(run_dir: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((run_dir / f"rank-{r}.json").read_text()) for r in range(world)]


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path, tpch: Tpch) -> None:
    cfg = tmp_path / "train.toml"
    cfg.write_text(config(tpch.built.path), encoding="utf-8")
    runs = tmp_path / "runs"
    common = (str(cfg), "--dir", str(runs), "--num-processes", "2")

    full = run(tmp_path, *common, "--run-name", "full")
    assert full.returncode == 0, full.stderr[-4000:]
    want = summaries(runs / "full", 2)
    assert want[0]["param_digest"] == want[1]["param_digest"]
    assert want[0]["checkpoint"]["steps"] == [4, 8, STEPS]

    # Kill (SIGKILL, every process of the run) once the first checkpoint is
    # committed and a later step is logged.
    killed = runs / "killed"
    kill_after = random.randint(EVERY + 1, 2 * EVERY - 1)
    proc = start(tmp_path, *common, "--run-name", "killed")
    wait_until(
        proc,
        lambda: committed(killed) and trainer_steps_logged(killed) >= kill_after,
        f"checkpoint {EVERY} and step {kill_after}",
    )
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    lost_from = committed(killed)[-1]
    logged = trainer_steps_logged(killed)
    assert lost_from < logged + 1 < STEPS, (lost_from, logged)
    assert not (killed / "rank-0.json").exists()

    r = run(tmp_path, "--resume", str(killed), "--num-processes", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    got = summaries(killed, 2)
    assert [s["start_step"] for s in got] == [lost_from, lost_from]
    assert got[0]["steps"] == STEPS - lost_from
    # The same parameters as the uninterrupted run, bit for bit.
    assert got[0]["param_digest"] == got[1]["param_digest"] == want[0]["param_digest"]

    # metrics.jsonl: each step once, the uninterrupted run's losses.
    tr = rows(killed, "trainer/loss")
    assert [x["step"] for x in tr] == list(range(STEPS)), f"killed after {logged}"
    assert [x["trainer/loss"] for x in tr] == pytest.approx(want[0]["losses"], rel=1e-6)
    assert [x["step"] for x in rows(killed, "val/loss")] == [4, 9, STEPS - 1]
    assert [x["step"] for x in rows(killed, "sampler/batches")] == list(range(STEPS))

    # W&B: one run (same id, two offline files), each step once, no seam.
    hist, files = wandb_history(tmp_path, killed)
    assert len(files) == 1 and len(list(killed.glob("wandb/offline-run-*"))) == 2, files
    trainer = [h for h in hist if "trainer/loss" in h]
    assert sorted(h["trainer/step"] for h in trainer) == list(range(STEPS))
    by_step = {h["trainer/step"]: h["trainer/loss"] for h in trainer}
    assert [by_step[s] for s in range(STEPS)] == pytest.approx(want[0]["losses"], rel=1e-6)
    tele = sorted(h["trainer/step"] for h in hist if "sampler/batches" in h)
    assert tele == list(range(STEPS))
    assert sorted(h["trainer/step"] for h in hist if "val/loss" in h) == [4, 9, STEPS - 1]


def test_sigterm_checkpoints_summarises_and_says_how_to_resume(
    tmp_path: Path, tpch: Tpch
) -> None:
    steps = 40
    cfg = tmp_path / "train.toml"
    cfg.write_text(config(tpch.built.path, steps=steps, every=0), encoding="utf-8")
    runs = tmp_path / "runs"
    run_dir = runs / "term"
    proc = start(tmp_path, str(cfg), "--dir", str(runs), "--num-processes", "2", "--run-name", "term")
    wait_until(proc, lambda: trainer_steps_logged(run_dir) >= 1, "step 1")
    proc.send_signal(signal.SIGTERM)  # the launcher only: it forwards to the ranks
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]

    s0, s1 = summaries(run_dir, 2)
    done = s0["steps"]
    assert 2 <= done < steps
    assert (s0["interrupted"], s1["interrupted"], s1["steps"]) == ("SIGTERM", "SIGTERM", done)
    assert s0["param_digest"] == s1["param_digest"]
    assert committed(run_dir) == [done] and s0["checkpoint"]["steps"] == [done]
    hint = f"headwater train --resume {run_dir} --num-processes 2"
    assert f"after step {done}" in err and hint in err, err[-2000:]
    assert trainer_steps_logged(run_dir) == done - 1

    # Refusals, before any training: a stream key, a model key, a new run
    # over the checkpoints.
    bad = run(tmp_path, "--resume", str(run_dir), "--set", "sampler.seed=5")
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "`seed`" in bad.stderr and f"checkpoint {done}" in bad.stderr, bad.stderr[-3000:]
    bad = run(tmp_path, "--resume", str(run_dir), "--set", "model.d_model=64")
    assert bad.returncode == 2 and "`model.d_model`: 32 in the checkpoint, 64 now" in bad.stderr
    bad = run(tmp_path, str(cfg), "--dir", str(runs), "--run-name", "term")
    assert bad.returncode == 2 and "already holds checkpoints" in bad.stderr, bad.stderr[-3000:]

    # The printed command, on one process instead of two (the sampler
    # continues the global cursors; parameters are replicated), stopped
    # again during the final evaluation: the last checkpoint is committed
    # before it starts, and the stop does not wait for its passes.
    proc = start(tmp_path, *hint.split()[2:-2])
    wait_until(proc, lambda: committed(run_dir)[-1:] == [steps], f"checkpoint {steps}")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]
    assert "stopping during the final evaluation: SIGTERM" in out, out[-3000:]
    assert f"after step {steps}, before the final evaluation ended" in err, err[-3000:]
    (s,) = summaries(run_dir, 1)
    assert (s["start_step"], s["steps"], s["world"], s["interrupted"]) == (
        done,
        steps - done,
        1,
        "SIGTERM",
    )
    assert [x["step"] for x in rows(run_dir, "trainer/loss")] == list(range(steps))
    assert not (run_dir / "final_phase.json").exists()
    # The final validation (one batch) may have ended before the stop.
    stopped_val = [x["val/loss"] for x in rows(run_dir, "val/loss") if x["step"] == steps - 1]

    # The resume reruns the final validation and evaluation alone.
    r = run(tmp_path, *hint.split()[2:-2])
    assert r.returncode == 0, r.stderr[-4000:]
    (s,) = summaries(run_dir, 1)
    assert (s["start_step"], s["steps"], s["interrupted"]) == (steps, 0, None)
    assert committed(run_dir)[-1] == steps
    assert [x["step"] for x in rows(run_dir, "trainer/loss")] == list(range(steps))
    assert [x["step"] for x in rows(run_dir, "val/loss")] == [4, 9, 14, 19, 24, 29, 34, steps - 1]
    # Rerun from the same sampler state: the same validation batch and loss.
    assert stopped_val in ([], [s["final_val_loss"]]), (stopped_val, s["final_val_loss"])
    for split in ("val", "test"):
        (row,) = rows(run_dir, f"eval/{split}/order_status/accuracy")
        assert row["step"] == steps - 1
        assert row[f"eval/{split}/order_status/accuracy"] == pytest.approx(
            s["eval"][split]["order_status"]["metrics"]["accuracy"]
        )
    # A run whose final phase ended has nothing left to resume.
    again = run(tmp_path, *hint.split()[2:-2])
    assert again.returncode == 2 and "nothing to resume" in again.stderr, again.stderr[-3000:]
