"""Device-side prefetch (``train.device_prefetch``, :mod:`headwater.train.prefetch`).

* the thread hands over its results in order, none lost, and stops after a
  batch that carries a stop request; an exception in it reaches the caller
  with its message; ``close`` ends a thread blocked on a full queue;
* with the real sampler: a checkpoint's stream state taken with batches
  still queued (``consumed_state``) continues, after a restore, with exactly
  the batches an uninterrupted stream gives next (their fingerprints);
* real runs on the session's TPC-H database: prefetch 2 ends with the
  parameters of prefetch 0, bit for bit, and the same losses (and, marked
  slow, so does a prefetch-2 run stopped by SIGTERM, checkpointed with
  batches queued, and resumed); the ``--profile`` breakdown adds up to the step time and states
  the thread's own sampler and host → device times; no ``trainer/mfu`` row
  on a CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SmallDb, Tpch, build_small_db, child_env, tiny_train_config

import headwater
from headwater.train.prefetch import Fetched, Prefetcher, consumed_state, produce


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: Any) -> SmallDb:
    return build_small_db(tmp_path_factory.mktemp("prefetch_small"), small_data)


def _item(i: int, flag: int = 0) -> Fetched:
    return Fetched(i, None, i, None, {"splits": {"train": i}}, 0.001, 0.002, flag)


def test_batches_come_in_order_and_the_thread_stops_after_a_stop_request() -> None:
    made = iter(range(100))
    pf = Prefetcher(lambda: _item(next(made)), depth=2)
    try:
        assert [pf.get()[0].batch for _ in range(20)] == list(range(20))
        assert pf.stats()["batches"] == 20
        assert pf.stats()["host_to_device_seconds_mean"] == pytest.approx(0.002)
    finally:
        pf.close()
    counter = iter(range(100))
    pf = Prefetcher(lambda: _item(i := next(counter), flag=15 if i == 3 else 0), depth=2)
    got = [pf.get()[0] for _ in range(4)]
    assert [(x.batch, x.flag) for x in got] == [(0, 0), (1, 0), (2, 0), (3, 15)]
    # Nothing after the batch that carried the stop request.
    with pytest.raises(RuntimeError, match="ended without a batch"):
        pf.get()
    assert next(counter) == 4, "the thread made no batch past the stop"


def test_the_thread_draws_no_batch_past_its_limit() -> None:
    """The loop's limit is the steps left: every batch drawn is stepped on
    (the sampler's delivered-batch counters equal the steps)."""
    made = iter(range(100))
    pf = Prefetcher(lambda: _item(next(made)), depth=3, limit=5)
    assert [pf.get()[0].batch for _ in range(5)] == list(range(5))
    with pytest.raises(RuntimeError, match="ended without a batch"):
        pf.get()
    assert next(made) == 5


def test_an_exception_in_the_thread_reaches_the_caller_with_its_message() -> None:
    n = iter(range(100))

    def make() -> Fetched:
        i = next(n)
        if i == 2:
            raise ValueError("sampler failed at batch 2: disk gone")
        return _item(i)

    pf = Prefetcher(make, depth=1)
    assert [pf.get()[0].batch for _ in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="sampler failed at batch 2: disk gone"):
        pf.get()
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetcher(make, depth=0)


def test_close_ends_a_thread_blocked_on_a_full_queue() -> None:
    pf = Prefetcher(lambda: _item(0), depth=1)
    time.sleep(0.2)  # the queue is full, the thread blocks on its put
    t0 = time.perf_counter()
    pf.close()
    assert time.perf_counter() - t0 < 2
    assert not any(t.name == "hw-prefetch" and t.is_alive() for t in threading.enumerate())


def test_checkpoint_state_with_batches_queued_resumes_the_same_stream(small: SmallDb) -> None:
    kw = {"default_batch_size": 4, "default_sequence_length": 32, "num_threads": 1, "seed": 3}

    def fp(b: dict[str, Any]) -> int:
        return int(b["fingerprint"][0])

    with headwater.Sampler(small.path, **kw) as s:
        want = [fp(s.next_train_batch()) for _ in range(12)]
    with headwater.Sampler(small.path, **kw) as s:
        pf = Prefetcher(lambda: produce(s, None, "train"), depth=3)
        taken = [pf.get()[0] for _ in range(5)]
        time.sleep(0.3)  # the thread runs ahead: 3 queued + 1 in hand
        s.next_val_batch()  # the loop's validation meanwhile
        state = consumed_state(s.state_dict(), taken[-1].state)
        val_next = fp(s.next_val_batch())
        pf.close()
        assert [fp(x.raw) for x in taken] == want[:5]
        assert s.state_dict()["splits"]["train"]["step"] > 5, "the thread ran ahead"
        assert np.asarray(taken[0].drain).size > 0
    with headwater.Sampler(small.path, **kw) as s:
        s.load_state_dict(state)
        assert [fp(s.next_train_batch()) for _ in range(7)] == want[5:]
        assert fp(s.next_val_batch()) == val_next, "the val stream as the loop left it"


STEPS = 30


def _cmd(tmp_path: Path, db: Path, name: str, prefetch: int, *args: str) -> list[str]:
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(
        tiny_train_config(
            db,
            STEPS,
            train=f"val_every = 4\neval_final = false\ndevice_prefetch = {prefetch}",
        ),
        encoding="utf-8",
    )
    args = ("--dir", str(tmp_path), "--run-name", name, "--wandb-mode", "disabled", *args)
    return [sys.executable, "-m", "headwater.cli", "train", str(cfg), *args]


def _run(tmp_path: Path, cmd: list[str], name: str) -> dict[str, Any]:
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=child_env(tmp_path), check=False
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s: dict[str, Any] = json.loads((tmp_path / name / "rank-0.json").read_text())
    s["stdout"] = r.stdout
    return s


def _losses(run_dir: Path) -> dict[int, float]:
    """Each logged step's loss (a line still being written is left out)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            break
        if "trainer/loss" in r:
            out[r["step"]] = r["trainer/loss"]
    return out


def _stopped_and_resumed(tmp_path: Path, db: Path) -> dict[str, Any]:
    """A prefetch-2 run stopped by SIGTERM after a few steps (a checkpoint with
    batches still queued), then resumed: its final summary."""
    run_dir = tmp_path / "stopped"
    proc = subprocess.Popen(
        _cmd(tmp_path, db, "stopped", 2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(tmp_path),
        start_new_session=True,
    )
    deadline = time.monotonic() + 400
    while not (run_dir / "metrics.jsonl").exists() or len(_losses(run_dir)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-3000:]
    stopped_at = len(_losses(run_dir))
    assert stopped_at < STEPS, "the run ended before the signal"
    resume = [sys.executable, "-m", "headwater.cli", "train", "--resume", str(run_dir)]
    return _run(tmp_path, resume, "stopped")


def test_prefetch_trains_the_same_parameters_and_profiles_the_thread(
    tmp_path: Path, tpch: Tpch
) -> None:
    pytest.importorskip("jax")
    db = tpch.built.path
    off = _run(tmp_path, _cmd(tmp_path, db, "off", 0), "off")
    on = _run(tmp_path, _cmd(tmp_path, db, "on", 2, "--profile"), "on")
    assert on["param_digest"] == off["param_digest"]
    assert on["losses"] == off["losses"]
    assert off["prefetch"] == {}
    pf = on["prefetch"]
    assert pf["depth"] == 2 and pf["batches"] == STEPS
    assert pf["host_to_device_seconds_mean"] > 0 and pf["sample_seconds_mean"] >= 0
    assert "prefetch thread (2 deep" in on["stdout"]
    # The phases add up to the steps' time: the summary's step rate is
    # theirs, and they fit in the run's wall clock.
    phases = on["phase_seconds_mean"]
    assert set(phases) == {"sample_wait", "host_to_device", "compute", "telemetry", "other"}
    assert min(phases.values()) >= 0 and phases["compute"] > 0
    per_step = sum(phases.values())
    assert on["batches_per_second"] == pytest.approx(1 / per_step, rel=1e-6)
    assert on["steady_steps"] * per_step <= on["train_seconds"]
    # Per-step MFU: absent on a CPU (no known peak), not 0 or NaN.
    rows = [json.loads(x) for x in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    trainer = [r for r in rows if "trainer/step_seconds" in r]
    assert len(trainer) == STEPS and not any("trainer/mfu" in r for r in rows)


@pytest.mark.slow
def test_a_stop_with_batches_queued_resumes_to_the_same_parameters(
    tmp_path: Path, tpch: Tpch
) -> None:
    """SIGTERM with prefetch 2 on one process (the thread pads and copies):
    the checkpoint holds the state after the batches stepped on, so the
    resumed run ends with the uninterrupted run's parameters and losses, bit
    for bit. Slow (three runs): the default suite checks the stream state
    with the real sampler above, and test_checkpoint's two-process stop and
    kill tests run with the default prefetch."""
    pytest.importorskip("jax")
    db = tpch.built.path
    full = _run(tmp_path, _cmd(tmp_path, db, "full", 2), "full")
    resumed = _stopped_and_resumed(tmp_path, db)
    assert 0 < resumed["start_step"] < STEPS
    assert resumed["param_digest"] == full["param_digest"]
    assert _losses(tmp_path / "stopped") == _losses(tmp_path / "full")
