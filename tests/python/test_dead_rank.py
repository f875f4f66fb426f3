"""The ``dead_rank`` pathology: two ``headwater train`` processes started the
way a cluster launcher starts them (coordinator, process count and id in the
environment), one of them killed or stopped mid-run.

The diag matrix (``test_diag.py``) runs each config as one ``headwater
diag`` call whose ranks the local launcher watches by PID, and judges the
finished run's rows; a run whose rank is killed has neither, so
``dead_rank`` is this test, with ``diag_configs/faults/dead_rank.toml``
(outside the matrix's folder) as its config:

* healthy: both processes finish, the watchdog stays quiet (no
  ``watchdog-rank*.json``, no "lost" line) although ``peer_timeout_s`` = 5 s
  is shorter than the run;
* SIGKILL of process 1 after a checkpoint: process 0 exits with status 3
  within ``peer_timeout_s`` + 10 s, naming rank 1 and the step, and the
  checkpoint it names resumes (``--resume`` on both processes) to the
  uninterrupted run's parameters, bit for bit (digest);
* SIGSTOP of process 0 (a hang of the process that also serves
  ``jax.distributed``'s key-value store): process 1 names rank 0 and exits
  with status 3 within the same bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Tpch, child_env, free_port, read_wandb_run

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "diag_configs" / "faults" / "dead_rank.toml"
TIMEOUT_S = 5.0
#: What a survivor may take beyond ``peer_timeout_s`` (the target).
SLACK_S = 10.0


def start_job(tmp: Path, db: Path, name: str, *args: str) -> list[subprocess.Popen[str]]:
    """Both processes of a 2-process job on a fresh coordinator port."""
    port = free_port()
    procs = []
    for i in range(2):
        env = child_env(tmp)
        env.update(
            HEADWATER_COORDINATOR=f"127.0.0.1:{port}",
            HEADWATER_NUM_PROCESSES="2",
            HEADWATER_PROCESS_ID=str(i),
        )
        cmd = [sys.executable, "-m", "headwater.cli", "train"]
        if "--resume" not in args:
            cmd += [str(CONFIG), "--dir", str(tmp / "runs"), "--run-name", name]
            cmd += ["--set", f'database.path="{db}"']
        procs.append(
            subprocess.Popen(
                [*cmd, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[tuple[int, str]]:
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def logged_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return -1
    steps = [-1]
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if "trainer/loss" in row:
            steps.append(row["step"])
    return max(steps)


def committed(run: Path) -> list[int]:
    d = run / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def wait_for(procs: list[subprocess.Popen[str]], cond: Any, what: str) -> None:
    deadline = time.monotonic() + 300
    while not cond():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            results = finish(procs, timeout=5)
            pytest.fail(f"the job ended or stalled before {what}: {results}")
        time.sleep(0.02)


def survivor_exit(p: subprocess.Popen[str], since: float) -> tuple[int, str, float]:
    """The survivor's status, output and seconds from the fault to its exit."""
    text, _ = p.communicate(timeout=TIMEOUT_S + SLACK_S + 60)
    return p.returncode, text, time.monotonic() - since


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory, tpch: Tpch) -> tuple[Path, list[Any]]:
    tmp = tmp_path_factory.mktemp("healthy")
    t0 = time.monotonic()
    results = finish(start_job(tmp, tpch.built.path, "full"))
    return tmp, [*results, time.monotonic() - t0]


def test_the_watchdog_stays_quiet_on_a_healthy_job(healthy: tuple[Path, list[Any]]) -> None:
    tmp, (*results, took) = healthy
    # Much longer than the timeout: the quiet is not just a short job.
    assert took > 2 * TIMEOUT_S, took
    for i, (rc, text) in enumerate(results):
        assert rc == 0, f"process {i}:\n{text[-4000:]}"
        assert " lost at step " not in text, text[-2000:]
    run = tmp / "runs" / "full"
    assert not list(run.glob("watchdog-rank*.json"))
    s = [json.loads((run / f"rank-{r}.json").read_text()) for r in range(2)]
    assert s[0]["config"]["train"]["peer_timeout_s"] == TIMEOUT_S
    assert s[0]["param_digest"] == s[1]["param_digest"]


def test_sigkill_of_a_rank_is_named_and_the_run_resumes_to_the_same_parameters(
    tmp_path: Path, tpch: Tpch, healthy: tuple[Path, list[Any]]
) -> None:
    run = tmp_path / "runs" / "killed"
    procs = start_job(tmp_path, tpch.built.path, "killed")
    wait_for(procs, lambda: committed(run) and logged_step(run) >= 6, "checkpoint 4 and step 6")
    procs[1].kill()  # SIGKILL
    t0 = time.monotonic()
    rc, text, took = survivor_exit(procs[0], t0)
    finish(procs)
    assert rc == 3, text[-4000:]
    assert took < TIMEOUT_S + SLACK_S, took
    rec = json.loads((run / "watchdog-rank0.json").read_text())
    assert (rec["lost_rank"], rec["rank"], rec["world"]) == (1, 0, 2)
    assert rec["step"] >= 6 and rec["checkpoint"] == committed(run)[-1] >= 4, rec
    assert f"rank 1 lost at step {rec['step']}" in text, text[-3000:]
    assert f"The last committed checkpoint is step {rec['checkpoint']}" in text
    assert "Traceback" not in text, text[-3000:]
    print(f"SIGKILL of rank 1: rank 0 exited {took:.1f} s later naming it")
    # ... and its W&B run says so.
    (wandb_dir,) = run.glob("wandb/offline-run-*")
    summary = read_wandb_run(wandb_dir, child_env(tmp_path))["summary"]
    assert (summary["trainer/lost_rank"], summary["trainer/lost_at_step"]) == (1, rec["step"])

    resumed = finish(start_job(tmp_path, tpch.built.path, "killed", "--resume", str(run)))
    for i, (code, out) in enumerate(resumed):
        assert code == 0, f"process {i}:\n{out[-4000:]}"
    got = [json.loads((run / f"rank-{r}.json").read_text()) for r in range(2)]
    want = json.loads((healthy[0] / "runs" / "full" / "rank-0.json").read_text())
    assert got[0]["start_step"] == rec["checkpoint"]
    assert got[0]["param_digest"] == got[1]["param_digest"] == want["param_digest"]


# A hang (SIGSTOP) costs another two-process job; the watchdog's silence
# rule it exercises is covered by test_watchdog.py's fake-clock tests in
# the default run (run this one with `pytest -m slow`).
@pytest.mark.slow
def test_a_hung_coordinator_process_is_named(tmp_path: Path, tpch: Tpch) -> None:
    run = tmp_path / "runs" / "stopped"
    procs = start_job(
        tmp_path, tpch.built.path, "stopped", "--set", 'logging.wandb_mode="disabled"'
    )
    wait_for(procs, lambda: logged_step(run) >= 3, "step 3")
    os.kill(procs[0].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        rc, text, took = survivor_exit(procs[1], t0)
    finally:
        procs[0].kill()  # SIGKILL ends a stopped process too
        finish(procs)
    assert rc == 3, text[-4000:]
    assert took < TIMEOUT_S + SLACK_S, took
    rec = json.loads((run / "watchdog-rank1.json").read_text())
    assert (rec["lost_rank"], rec["rank"]) == (0, 1) and rec["step"] >= 3, rec
    assert f"rank 0 lost at step {rec['step']}" in text, text[-3000:]
    assert "served by process 0, has not answered" in text
    print(f"SIGSTOP of rank 0: rank 1 exited {took:.1f} s later naming it")
