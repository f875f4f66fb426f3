"""One ``Sampler`` used from several Python threads.

The contract (docs/sampling.md, "Threads"): ``next_train_batch()`` /
``next_val_batch()`` deliver every batch of the stream exactly once and in
step order to whichever thread gets it; ``drain_step_metrics()`` and
``state_dict()`` may run beside them (a state is always a position the
stream was really at); a shared evaluation pass yields each batch to one
caller; nothing leaves the sampler broken for later single-threaded use;
a thread waiting behind another's delivery still answers Ctrl-C.

A batch dict has no step key: a batch's step is the position of its
``fingerprint`` in a single-threaded run of the same configuration (the
fingerprints of the runs used here are distinct, which is checked).

The train-stream hammer runs a few times by default; ``pytest -m slow``
runs it 100 times in a row (the issue's target).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SmallData, SmallDb, build_small_db

from headwater import _native

N: Any = _native

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_v1"
# Small, fast batches: the threads contend on nearly every call.
CFG: dict[str, Any] = {"default_batch_size": 4, "default_sequence_length": 32, "num_prefetch": 2}
THREADS = 4


def fingerprint(batch: dict[str, Any]) -> int:
    return int(batch["fingerprint"][0])


def reference(n: int, split: str = "train", state: Any = None) -> list[int]:
    """The first ``n`` fingerprints of ``split`` taken from one thread."""
    with N.Sampler(GOLDEN, state=state, **CFG) as s:
        take = s.next_train_batch if split == "train" else s.next_val_batch
        return [fingerprint(take()) for _ in range(n)]


def steps_of(ref: list[int], got: list[int]) -> list[int]:
    index = {fp: i for i, fp in enumerate(ref)}
    assert len(index) == len(ref), "the reference run repeats a fingerprint"
    missing = [fp for fp in got if fp not in index]
    assert not missing, f"{len(missing)} delivered batches are not in the reference run"
    return [index[fp] for fp in got]


def check_delivery(ref: list[int], per_thread: list[list[int]], total: int) -> None:
    """Every step below ``total`` exactly once; increasing within each thread."""
    steps = [steps_of(ref, got) for got in per_thread]
    for i, st in enumerate(steps):
        assert st == sorted(st) and len(set(st)) == len(st), (
            f"thread {i} got steps out of order: {st}"
        )
    union = sorted(s for st in steps for s in st)
    assert union == list(range(total)), "the threads' batches are not each step exactly once"


def hammer(ref: list[int], per_thread: int) -> None:
    """4 consumer threads + 1 thread draining metrics and taking states."""
    total = THREADS * per_thread
    got: list[list[int]] = [[] for _ in range(THREADS)]
    states: list[dict[str, Any]] = []
    drained = [0.0]
    errors: list[BaseException] = []
    done = threading.Event()
    start = threading.Barrier(THREADS + 1)

    def consume(i: int) -> None:
        try:
            start.wait()
            for _ in range(per_thread):
                got[i].append(fingerprint(s.next_train_batch()))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    def observe() -> None:
        try:
            start.wait()
            while not done.is_set():
                drained[0] += s.drain_step_metrics().get("sampler/batches", 0.0)
                states.append(s.state_dict())
        except BaseException as e:
            errors.append(e)

    with N.Sampler(GOLDEN, **CFG) as s:
        consumers = [threading.Thread(target=consume, args=(i,)) for i in range(THREADS)]
        observer = threading.Thread(target=observe)
        for t in [*consumers, observer]:
            t.start()
        for t in consumers:
            t.join(timeout=60)
        done.set()
        observer.join(timeout=60)
        assert not any(t.is_alive() for t in [*consumers, observer]), "a thread hung"
        assert not errors, f"a thread failed: {errors[0]!r}"
        check_delivery(ref, got, total)
        # Telemetry saw each delivered batch once.
        drained[0] += s.drain_step_metrics().get("sampler/batches", 0.0)
        assert drained[0] == total
        # Every state read mid-delivery is a position the stream passed
        # through, in order, and the final one is after the last batch.
        steps = [st["splits"]["train"]["step"] for st in states]
        assert steps == sorted(steps) and all(0 <= x <= total for x in steps)
        assert s.state_dict()["splits"]["train"]["step"] == total
        # Still fine from one thread.
        assert [fingerprint(s.next_train_batch()) for _ in range(3)] == ref[total : total + 3]
    # A state taken mid-run resumes at the batch its step names.
    mid = [st for st in states if 0 < st["splits"]["train"]["step"] < total]
    if mid:
        st = mid[len(mid) // 2]
        k = st["splits"]["train"]["step"]
        assert reference(2, state=st) == ref[k : k + 2]


def test_four_threads_deliver_every_train_batch_once_in_step_order() -> None:
    per_thread = 100
    ref = reference(THREADS * per_thread + 3)
    for _ in range(5):
        hammer(ref, per_thread)


@pytest.mark.slow
def test_four_thread_hammer_passes_100_runs_in_a_row() -> None:
    per_thread = 50
    ref = reference(THREADS * per_thread + 3)
    for run in range(100):
        try:
            hammer(ref, per_thread)
        except AssertionError as e:
            raise AssertionError(f"run {run} of 100: {e}") from e


def test_train_and_val_streams_from_two_threads_each() -> None:
    n = 60
    ref = {"train": reference(2 * n), "val": reference(2 * n, split="val")}
    got: dict[str, list[list[int]]] = {"train": [[], []], "val": [[], []]}
    errors: list[BaseException] = []
    with N.Sampler(GOLDEN, **CFG) as s:

        def consume(split: str, i: int) -> None:
            take = s.next_train_batch if split == "train" else s.next_val_batch
            try:
                for _ in range(n):
                    got[split][i].append(fingerprint(take()))
            except BaseException as e:
                errors.append(e)

        threads = [
            threading.Thread(target=consume, args=(sp, i))
            for sp in ("train", "val")
            for i in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, f"a thread failed: {errors[0]!r}"
        for split in ("train", "val"):
            check_delivery(ref[split], got[split], 2 * n)
        state = s.state_dict()["splits"]
        assert state["train"]["step"] == state["val"]["step"] == 2 * n


def test_skip_from_another_thread_keeps_the_stream_whole() -> None:
    """``skip`` beside three consumers: what they get is the stream with
    exactly the skipped steps missing, each thread's steps increasing."""
    per_thread, skips = 40, 5
    ref = reference(3 * per_thread + skips * 3 + 3)
    got: list[list[int]] = [[], [], []]
    errors: list[BaseException] = []
    with N.Sampler(GOLDEN, **CFG) as s:

        def consume(i: int) -> None:
            try:
                for _ in range(per_thread):
                    got[i].append(fingerprint(s.next_train_batch()))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for _ in range(skips):
            time.sleep(0.005)
            s.skip(1)
        for t in threads:
            t.join(timeout=60)
        assert not errors, f"a thread failed: {errors[0]!r}"
        steps = [steps_of(ref, g) for g in got]
        for st in steps:
            assert st == sorted(st)
        union = sorted(x for st in steps for x in st)
        assert len(union) == len(set(union)) == 3 * per_thread
        end = s.state_dict()["splits"]["train"]["step"]
        assert end == 3 * per_thread + skips
        assert len(set(range(end)) - set(union)) == skips
        assert fingerprint(s.next_train_batch()) == ref[end]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> SmallDb:
    return build_small_db(tmp_path_factory.mktemp("threads_small"), small_data)


def test_one_evaluation_pass_shared_by_three_threads(small: SmallDb) -> None:
    kw = {"default_batch_size": 2, "default_sequence_length": 32}
    with N.Sampler(small.path, **kw) as s:
        ref = [fingerprint(b) for b in s.eval_batches("val")]
        assert len(ref) >= 6 and len(set(ref)) == len(ref)
        s.drain_step_metrics("val")
        shared = iter(s.eval_batches("val"))
        got: list[list[int]] = [[], [], []]

        def consume(i: int) -> None:
            for b in shared:
                got[i].append(fingerprint(b))

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        check_delivery(ref, got, len(ref))
        assert s.drain_step_metrics("val")["sampler/batches"] == len(ref)


CTRL_C_BEHIND_ANOTHER_THREAD = """
import signal, sys, threading, time
from headwater import _native as N
signal.signal(signal.SIGINT, signal.default_int_handler)
# 1.5 s per batch: a second thread waits on the same split, so the main
# thread's wait is mostly behind the split's delivery gate.
s = N.Sampler(sys.argv[1], default_batch_size=4, default_sequence_length=32,
              num_threads=1, num_prefetch=1, debug_batch_delay_ms=1500.0)
threading.Thread(target=s.next_train_batch, daemon=True).start()
time.sleep(0.2)
print("READY", flush=True)
try:
    s.next_train_batch()
    print("NO-INTERRUPT", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", time.monotonic(), flush=True)
    s.next_train_batch()  # the sampler still works from this thread
    print("AFTER", flush=True)
    s.shutdown()
"""


def test_ctrl_c_interrupts_a_wait_behind_another_thread() -> None:
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    code = textwrap.dedent(CTRL_C_BEHIND_ANOTHER_THREAD)
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(GOLDEN)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        time.sleep(0.3)  # the child is in its wait by now
        t_sig = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = [ln for ln in out.splitlines() if ln.startswith("INTERRUPTED")]
    assert lines, f"no KeyboardInterrupt in the child; stdout {out!r}; stderr:\n{err}"
    assert float(lines[0].split()[1]) - t_sig < 1.0
    assert "AFTER" in out, err
