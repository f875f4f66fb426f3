"""``headwater train`` under a cluster launcher: processes started by this
test (not by headwater's launcher) with the coordinator address, process
count and id in the environment, several local CPU devices each.

* "two hosts": 4 processes × 2 local devices train; every rank ends with
  the same parameters (digest) and losses, and the same losses and
  parameter norm, to float32 rounding, as a 1-process run over 8 local
  devices fed the same global batches (``cluster_reference.py``), and rank 0's offline W&B run has each step once;
* bad input: a coordinator that never answers (a closed local port) is an
  error naming the address within the timeout; a process id outside the
  job and ranks whose telemetry schemas differ are refused with the ranks
  named.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Tpch, child_env, free_port, read_wandb_run
from test_train import tiny_config

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("wandb")

STEPS = 4


def start(
    tmp_path: Path, cfg: Path, env: dict[str, str], name: str, *args: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headwater.cli",
            "train",
            str(cfg),
            "--dir",
            str(tmp_path / "runs"),
            "--run-name",
            name,
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def wait_all(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[tuple[int, str]]:
    """Every process's (status, output); kills the rest (by PID) on a timeout."""
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


def cluster_env(tmp_path: Path, devices: int, **job: str) -> dict[str, str]:
    env = child_env(tmp_path)
    env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
    env.update({f"HEADWATER_{k.upper()}": v for k, v in job.items()})
    return env


def summary(tmp_path: Path, name: str, rank: int) -> dict[str, Any]:
    return json.loads((tmp_path / "runs" / name / f"rank-{rank}.json").read_text())


def test_two_hosts_under_a_cluster_launcher_match_one_process(tmp_path: Path, tpch: Tpch) -> None:
    """4 processes × 2 devices (two "hosts") == 1 process × 8 devices fed the
    same global batches: the per-rank sampler streams of a 4-rank job,
    laid out over the devices in the same order."""
    cfg = tmp_path / "train.toml"
    cfg.write_text(
        tiny_config(tpch.built.path).replace("steps = 6", f"steps = {STEPS}"),
        encoding="utf-8",
    )
    overrides = ["--set", "train.val_every=0", "--set", "train.val_batches=0"]
    port = free_port()
    procs = [
        start(
            tmp_path,
            cfg,
            cluster_env(
                tmp_path,
                2,
                coordinator=f"127.0.0.1:{port}",
                num_processes="4",
                process_id=str(i),
                coordinator_timeout_s="120",
            ),
            "hosts",
            *overrides,
        )
        for i in range(4)
    ]
    results = wait_all(procs)
    for i, (rc, text) in enumerate(results):
        assert rc == 0, f"process {i}:\n{text[-4000:]}"
    ranks = [summary(tmp_path, "hosts", r) for r in range(4)]
    layout = ranks[0]["batch_layout"]
    assert (layout["devices"], layout["local_devices"], layout["global_batch"]) == (8, 2, 16)
    assert "global batch 16 = 2 per device × 8 devices" in results[0][1]
    assert len({s["param_digest"] for s in ranks}) == 1
    assert all(s["losses"] == ranks[0]["losses"] for s in ranks)

    # The reference: one process, 8 devices, the same four sampler streams.
    ref = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("cluster_reference.py")),
            str(cfg),
            str(tmp_path / "ref.json"),
            "4",
            *overrides,
        ],
        capture_output=True,
        text=True,
        env=cluster_env(tmp_path, 8),
        timeout=300,
        check=False,
    )
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-4000:]
    one = json.loads((tmp_path / "ref.json").read_text())
    assert one["devices"] == 8
    # The first loss (the same global batch through the same initial
    # parameters, before any cross-process reduction) to float32 rounding.
    # After it, gloo's all-reduce across processes sums the gradients in
    # another order than the in-process one, and Adam's normalisation turns
    # those last-bit differences into relative differences that grow step by
    # step (1.9e-4 at the fourth step in one run at load average 12), so the
    # later losses and the final parameters match to 1e-3. Within one job
    # every rank is bit-identical (above).
    assert one["losses"][0] == pytest.approx(ranks[0]["losses"][0], rel=1e-6)
    assert one["losses"] == pytest.approx(ranks[0]["losses"], rel=1e-3)
    assert one["param_norm"] == pytest.approx(ranks[0]["param_norm"], rel=1e-3)

    run = read_wandb_run(Path(ranks[0]["wandb_dir"]), child_env(tmp_path))
    steps = [row["trainer/step"] for row in run["history"] if "trainer/loss" in row]
    assert steps == list(range(STEPS))
    tele = [row["trainer/step"] for row in run["history"] if "sampler/batches" in row]
    assert tele == list(range(STEPS))
    assert all(summary(tmp_path, "hosts", r)["wandb_dir"] is None for r in (1, 2, 3))


def test_a_coordinator_that_never_answers_is_named(tmp_path: Path, tpch: Tpch) -> None:
    cfg = tmp_path / "train.toml"
    cfg.write_text(tiny_config(tpch.built.path), encoding="utf-8")
    closed = free_port()  # bound and released: nothing listens there
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "headwater.cli",
            "train",
            str(cfg),
            "--dir",
            str(tmp_path / "runs"),
            "--coordinator",
            f"127.0.0.1:{closed}",
            "--num-processes",
            "2",
            "--process-id",
            "1",
            "--coordinator-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        env=child_env(tmp_path),
        timeout=120,
        check=False,
    )
    assert r.returncode != 0
    assert f"coordinator 127.0.0.1:{closed} (from --coordinator) did not answer within 2 s" in (
        r.stderr
    )
    assert "Aborted" not in r.stderr and "Check failure" not in r.stderr


@pytest.mark.parametrize(
    ("ids", "messages"),
    [
        # Two processes 1 among three: every process is refused, the
        # duplicate named (processes in start order).
        ((0, 1, 1), ["process id 1 given twice"] * 3),
        # Two processes 0: the second cannot take the coordinator's port;
        # the first hears from no process 1 within the timeout.
        ((0, 0), ["did not check in within 4 s", "cannot serve the coordinator"]),
    ],
)
def test_duplicate_process_ids_are_refused_naming_them(
    tmp_path: Path, tpch: Tpch, ids: tuple[int, ...], messages: list[str]
) -> None:
    cfg = tmp_path / "train.toml"
    cfg.write_text(tiny_config(tpch.built.path), encoding="utf-8")
    port = free_port()
    procs = []
    for i in ids:
        env = cluster_env(
            tmp_path,
            1,
            coordinator=f"127.0.0.1:{port}",
            num_processes=str(len(ids)),
            process_id=str(i),
            coordinator_timeout_s="4",
        )
        procs.append(start(tmp_path, cfg, env, "dup"))
        time.sleep(0.5)  # process 0 first, so that it owns the port
    results = wait_all(procs, timeout=120)
    texts = [t for _, t in results]
    assert all(rc != 0 for rc, _ in results), texts
    for text in texts:
        assert "Check failure" not in text and "Aborted" not in text, text[-2000:]
    for text, m in zip(texts, messages, strict=True):
        assert m in text, (m, text[-3000:])


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--coordinator", "127.0.0.1:1", "--num-processes", "2", "--process-id", "2"],
            {},
            "--process-id: process_id = 2 is outside 0..1 (num_processes = 2 from --num-processes)",
        ),
        (
            [],
            {"HEADWATER_COORDINATOR": "127.0.0.1:1", "HEADWATER_NUM_PROCESSES": "3"},
            "a coordinator (127.0.0.1:1) needs --process-id (or $HEADWATER_PROCESS_ID)",
        ),
        (
            ["--num-processes", "2", "--process-id", "1"],
            {},
            "process_id = 1 needs a coordinator",
        ),
        (
            ["--coordinator", "nohost", "--num-processes", "2", "--process-id", "0"],
            {},
            "coordinator = 'nohost' is not HOST:PORT",
        ),
    ],
)
def test_inconsistent_job_arguments_are_refused(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "headwater.cli", "train", "--steps", "1", *args],
        capture_output=True,
        text=True,
        env={**child_env(tmp_path), **env},
        timeout=120,
        check=False,
    )
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


def test_ranks_with_different_schemas_are_named_at_start(tmp_path: Path, tpch: Tpch) -> None:
    """Each host started with its own config file, one with another ``S``
    (``[ranks.N]`` cannot set a stream key, so the mismatch comes from
    outside headwater's config checks)."""
    cfgs = []
    for i, s in enumerate((64, 128)):
        cfg = tmp_path / f"train-{i}.toml"
        text = tiny_config(tpch.built.path)
        text = text.replace("default_sequence_length = 64", f"default_sequence_length = {s}")
        assert f"default_sequence_length = {s}" in text
        cfg.write_text(text, encoding="utf-8")
        cfgs.append(cfg)
    port = free_port()
    procs = [
        start(
            tmp_path,
            cfgs[i],
            cluster_env(
                tmp_path, 1, coordinator=f"127.0.0.1:{port}", num_processes="2", process_id=str(i)
            ),
            "skew",
        )
        for i in range(2)
    ]
    results = wait_all(procs, timeout=200)
    assert all(rc != 0 for rc, _ in results)
    text = results[0][1]
    assert "ranks disagree on the telemetry schema / batch shapes" in text, text[-3000:]
    assert "ranks [0]: B=4 S=64 max_hops=" in text and "ranks [1]: B=4 S=128" in text
