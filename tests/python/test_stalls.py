"""The stall detector and the kernel probes, on a real sampler (seconds,
not a training run: the fast siblings of the ``stuck_worker`` and
``cold_cache`` diag configs).

* a worker stuck past ``stall_after_ms`` is counted once (``stalls``) and its
  stack is on disk within 2x the threshold, naming the function;
* a dump directory that cannot be written is counted
  (``stall_dump_failures``), never fatal;
* ``stall_after_ms`` <= 0 or absurdly small is a ``ConfigError`` naming it;
* the database's pages dropped before each batch show as major faults, bytes
  read and blocked time; a warm run takes none;
* dropped the same way, the working set reads as not resident and the bytes
  read per byte used as amplified: both diag signals fire; warm, both are
  inside their bands;
* sampler threads pinned to a CPU a spinning process keeps busy spend their
  build time runnable but not running (``cpu/runqueue_seconds``).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Tpch

from headwater import _native as N

FAST = {"default_batch_size": 8, "default_sequence_length": 256, "num_threads": 1}


def drained(s: Any, batches: int) -> dict[str, float]:
    """Totals of the drained step metrics over ``batches`` batches."""
    out: dict[str, float] = {}
    for _ in range(batches):
        s.next_train_batch()
        for k, v in s.drain_step_metrics().items():
            out[k] = (
                out.get(k, 0.0) + v
                if k.endswith(("seconds", "faults", "bytes", "stalls", "failures"))
                else v
            )
    return out


def test_a_stuck_worker_is_dumped_and_counted_once(tpch: Tpch, tmp_path: Path) -> None:
    with N.Sampler(
        tpch.built.path,
        **FAST,
        num_prefetch=1,
        stall_after_ms=150.0,
        stall_dump_dir=str(tmp_path),
        debug_stall_step=3,
        debug_stall_ms=900.0,
    ) as s:
        got = drained(s, 8)
    assert got["sampler/stalls"] == 1 and got["sampler/stall_dump_failures"] == 0
    (dump,) = tmp_path.glob("stall-rank0-*.txt")
    text = dump.read_text()
    m = re.search(r"in stage bfs of step 3 for (\d+) ms \(stall_after_ms 150\)", text)
    assert m and 150 <= int(m[1]) < 300, text[:400]
    stuck = next(ln for ln in text.splitlines() if ln.startswith("stuck in: "))
    assert "injected_stall" in stuck, stuck


def test_quiet_without_a_stuck_worker(tpch: Tpch, tmp_path: Path) -> None:
    """The same sampler, nothing stuck: no stall, no dump (the automatic
    threshold, and an explicit one well above a build)."""
    for after in (None, 500.0):
        with N.Sampler(
            tpch.built.path, **FAST, stall_after_ms=after, stall_dump_dir=str(tmp_path)
        ) as s:
            got = drained(s, 20)
        assert got["sampler/stalls"] == 0
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_dump_is_counted_not_fatal(tpch: Tpch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with N.Sampler(
        tpch.built.path,
        **FAST,
        num_prefetch=1,
        stall_after_ms=100.0,
        stall_dump_dir=str(blocker / "dumps"),
        debug_stall_step=2,
        debug_stall_ms=600.0,
    ) as s:
        got = drained(s, 6)
        # The failure is reported with a batch made after it.
        deadline = time.monotonic() + 10
        while got.get("sampler/stall_dump_failures", 0) == 0 and time.monotonic() < deadline:
            got["sampler/stall_dump_failures"] = (
                got.get("sampler/stall_dump_failures", 0)
                + drained(s, 1)["sampler/stall_dump_failures"]
            )
    assert got["sampler/stalls"] == 1
    assert got["sampler/stall_dump_failures"] == 1


@pytest.mark.parametrize("value", [0.0, -5.0, 1.0, 9.99, math.nan, 1e12])
def test_bad_stall_after_ms_names_the_key(tpch: Tpch, value: float) -> None:
    with pytest.raises(N.ConfigError) as e:
        N.Sampler(tpch.built.path, **FAST, stall_after_ms=value)
    assert e.value.key == "stall_after_ms" and _range("stall_after_ms") in str(e.value)


def _range(key: str) -> str:
    """The allowed range every error for ``key`` states (its schema row)."""
    return next(f["range"] for f in N.sampler_config_schema() if f["name"] == key)


def test_a_cold_page_cache_shows_as_faults_bytes_and_blocked_time(tpch: Tpch) -> None:
    with N.Sampler(tpch.built.path, **FAST, num_prefetch=1, debug_drop_page_cache_every=1) as s:
        cold = drained(s, 12)
    assert cold["sampler/io/major_faults"] > 12, cold
    assert cold["sampler/io/read_bytes"] >= 4096 * cold["sampler/io/major_faults"], cold
    assert cold["sampler/io/blocked_seconds"] > 0, cold
    assert cold["sampler/first_batch_seconds"] > 0
    with N.Sampler(tpch.built.path, **FAST, num_prefetch=1) as s:
        drained(s, 30)  # warm the cache
        warm = drained(s, 12)
    assert warm["sampler/io/major_faults"] == 0, warm
    assert warm["sampler/io/read_bytes"] == 0, warm


def _io_signals(s: Any, steps: int) -> dict[str, float]:
    """The diag statistic of the two working-set signals over ``steps``
    steps of one batch each (the rows the diag reads)."""
    from headwater.diag.signals import SIGNALS

    rows = []
    for _ in range(steps):
        s.next_train_batch()
        rows.append(s.drain_step_metrics())
    names = ("io/working_set_resident", "io/read_amplification")
    return {n: SIGNALS[n].stat(rows, {}) for n in names}


def test_a_cold_working_set_lights_residency_and_read_amplification(tpch: Tpch) -> None:
    from headwater.diag.signals import SIGNALS

    resident, amplified = SIGNALS["io/working_set_resident"], SIGNALS["io/read_amplification"]
    with N.Sampler(tpch.built.path, **FAST, num_prefetch=1, debug_drop_page_cache_every=1) as s:
        cold = _io_signals(s, 12)
    assert cold["io/working_set_resident"] < resident.band[0], cold
    assert cold["io/read_amplification"] > amplified.band[1], cold
    with N.Sampler(tpch.built.path, **FAST, num_prefetch=1) as s:
        drained(s, 30)  # warm the cache
        warm = _io_signals(s, 12)
    assert warm["io/working_set_resident"] == 1.0, warm
    assert warm["io/read_amplification"] == 0.0, warm


def test_a_pinned_sampler_on_a_busy_cpu_waits_in_the_run_queue(tpch: Tpch) -> None:
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        time.sleep(0.2)
        with N.Sampler(
            tpch.built.path,
            **{**FAST, "default_sequence_length": 1024, "bfs_child_width": 16},
            num_prefetch=1,
            debug_pin_cpu=cpu,
        ) as s:
            got = drained(s, 20)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    share = got["sampler/cpu/runqueue_seconds"] / got["sampler/cpu/build_seconds"]
    assert share >= 0.25, got
    busy = got["sampler/cpu/busy_seconds"] / got["sampler/cpu/build_seconds"]
    assert busy < 0.75, got


def _hog_threads() -> list[str]:
    comms = (Path(f"/proc/self/task/{t}/comm") for t in os.listdir("/proc/self/task"))
    out = []
    for c in comms:
        try:
            name = c.read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name == "headwater-debug-hog"[:15]:  # the kernel keeps 15 bytes
            out.append(name)
    return out


def _spun(tpch: Tpch, hog: bool, batches: int = 8) -> tuple[dict[str, float], int]:
    """Totals of a sampler whose builds burn 20 ms of CPU each, pinned to one
    CPU, with or without the debug hog on that CPU; the hog threads seen."""
    cpu = min(os.sched_getaffinity(0))
    with N.Sampler(
        tpch.built.path,
        **FAST,
        num_prefetch=1,
        debug_spin_ms=20.0,
        debug_pin_cpu=cpu,
        debug_cpu_hog=hog,
    ) as s:
        got = drained(s, batches)  # the hog names itself once started
        hogs = len(_hog_threads())
    return got, hogs


def test_a_debug_hog_starves_a_pinned_sampler_and_stops_with_it(tpch: Tpch) -> None:
    """debug_cpu_hog: one busy thread on the sampler's CPU, no outside
    process: the spinning builds wait in the run queue about as long as
    they run; without the hog the same spin runs unstarved."""
    starved, hogs = _spun(tpch, hog=True)
    assert hogs == 1 and _hog_threads() == []  # stopped and joined at shutdown
    share = starved["sampler/cpu/runqueue_seconds"] / starved["sampler/cpu/build_seconds"]
    assert share >= 0.25, starved
    # The spin is CPU time: 20 ms of it per build, whatever the wall clock.
    assert starved["sampler/cpu/busy_seconds"] >= 8 * 0.020, starved
    alone, hogs = _spun(tpch, hog=False)
    assert hogs == 0
    assert alone["sampler/cpu/busy_seconds"] >= 8 * 0.020, alone
    assert alone["sampler/cpu/build_seconds"] < starved["sampler/cpu/build_seconds"], (
        alone,
        starved,
    )


@pytest.mark.parametrize(
    ("kw", "key", "where"),
    [
        ({"debug_spin_ms": -1.0}, "debug_spin_ms", "allowed: a number in"),
        ({"debug_spin_ms": math.nan}, "debug_spin_ms", "allowed: a number in"),
        ({"debug_cpu_hog": True}, "debug_cpu_hog", "with debug_pin_cpu set"),
    ],
)
def test_bad_spin_and_hog_keys_name_the_key(
    tpch: Tpch, kw: dict[str, Any], key: str, where: str
) -> None:
    with pytest.raises(N.ConfigError) as e:
        N.Sampler(tpch.built.path, **FAST, **kw)
    assert e.value.key == key and where in str(e.value), str(e.value)
    assert _range(key) in str(e.value), str(e.value)
