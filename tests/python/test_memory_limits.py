"""``headwater bench --memory-limit``: runs in a memory cgroup (page cache
included) and a read throttle, each from a dropped page cache, and the clear
errors of a host or an argument that cannot give them; a database larger
than what its cgroup leaves for the page cache lights the read-amplification
signal and reads as not wholly resident."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Tpch

from headwater.bench import limits as bench_limits
from headwater.bench.limits import LimitError, Limits, parse_size

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v2"
BENCH = [sys.executable, "-m", "headwater.cli", "bench", str(GOLDEN), "--batch-size", "4",
         "--seq-len", "64", "--warmup", "1"]


def _host_can_limit() -> str | None:
    """Why this host cannot run limited benches, or None."""
    if os.geteuid() != 0:
        return "not root"
    try:
        bench_limits.cgroup_version()
    except LimitError as e:
        return str(e)
    return None


def test_a_limited_run_is_charged_its_reads_and_stays_under_its_limit() -> None:
    why = _host_can_limit()
    cmd = [*BENCH, "--memory-limit", "none,160MiB", "--seconds", "1", "--rounds", "1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if why is not None:
        # The host cannot: the error says what is missing, nothing is run.
        assert r.returncode == 2 and ("root" in r.stderr or "cgroup" in r.stderr), r.stderr
        return
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    free, limited = out["runs"]
    assert free["memory_limit_bytes"] is None and limited["memory_limit_bytes"] == 160 << 20
    assert limited["limits"] == "160 MiB"
    # The cgroup charged the run, page cache included, and held it to its limit.
    assert 0 < limited["cgroup_peak_bytes"] <= 160 << 20
    # The page cache was dropped before it: the database had to be read.
    assert limited["read_bytes"] > 0
    assert limited["best_batches_per_s"] > 0 and free["best_batches_per_s"] > 0
    assert free["ratio_to_first"] == 1.0
    assert limited["ratio_to_first"] == pytest.approx(
        limited["best_batches_per_s"] / free["best_batches_per_s"]
    )
    # The unlimited run read its database in before timing (populate): its
    # timed batches found every probed page cached and read nothing.
    assert free["working_set_resident"] == 1.0 and free["read_amplification"] == 0.0
    assert 0.0 <= limited["working_set_resident"] <= 1.0 and limited["read_amplification"] >= 0.0
    text = bench_limits.format_limited(out)
    assert "160 MiB" in text and "no memory limit" in text and "page cache dropped" in text
    assert "resident" in text and "read/used" in text


def test_a_limit_the_run_cannot_fit_in_is_named() -> None:
    if _host_can_limit() is not None:
        pytest.skip(f"this host cannot limit a run: {_host_can_limit()}")
    cmd = [*BENCH, "--memory-limit", "4MiB", "--seconds", "1", "--rounds", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "killed at --memory-limit 4194304 bytes" in r.stderr and "raise the limit" in r.stderr


def test_a_database_larger_than_its_cgroup_is_read_amplified_and_not_resident(
    tpch: Tpch,
) -> None:
    """TPC-H SF 0.01 (14 MB) in a cgroup where the sampler's own memory
    leaves a few MiB of page cache: measured 0.28-0.63 of the probed pages
    resident and 29-33 bytes read per byte used at 52 MiB (at 56 MiB: 0.89
    and 12; unlimited: 1 and 0). How much page cache a limit leaves depends
    on the interpreter's own memory on the host (a clean clone's left
    enough at 52 MiB for 2 bytes per byte), so the limit steps down by
    4 MiB until the run reads amplified; a limit the run cannot fit in
    before that skips only if it is the first one."""
    from headwater.diag.signals import SIGNALS

    why = _host_can_limit()
    if why is not None:
        pytest.skip(f"this host cannot limit a run: {why}")
    runs = []
    for mib in (52, 48, 44, 40):
        cmd = [sys.executable, "-m", "headwater.cli", "bench", str(tpch.built.path),
               "--threads", "1", "--warmup", "2", "--memory-limit", f"{mib}MiB", "--seconds",
               "1", "--rounds", "1", "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode == 2 and "the sampler's own memory does not fit" in r.stderr:
            if not runs:
                pytest.skip(f"this host's interpreter needs more than {mib} MiB: {r.stderr}")
            break
        assert r.returncode == 0, r.stderr
        (run,) = json.loads(r.stdout)["runs"]
        runs.append(run)
        if run["read_amplification"] > SIGNALS["io/read_amplification"].band[1]:
            break
    run = runs[-1]
    assert run["read_amplification"] > SIGNALS["io/read_amplification"].band[1], runs
    assert run["working_set_resident"] < 1.0, runs


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--memory-limit", "12x"], "--memory-limit '12x': expected a size"),
        (["--memory-limit", "1000"], "--memory-limit '1000': 1000 bytes is below 1 MiB"),
        (["--memory-limit", "600MiB", "--read-bps", "fast"], "--read-bps 'fast': expected a size"),
    ],
)
def test_bad_limits_are_refused_before_any_run(flags: list[str], message: str) -> None:
    r = subprocess.run([*BENCH, *flags], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_sizes_and_labels() -> None:
    assert parse_size("600MiB") == 600 << 20
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("629145600") == 629145600
    assert parse_size("none") is None
    assert Limits(600 << 20, 200 << 20, 2000).label() == "600 MiB, 200 MiB/s, 2000 IOPS"
    assert Limits(None).label() == "no memory limit"


def test_a_throttle_needs_a_block_device() -> None:
    # procfs has no block device behind it (device number 0:N).
    with pytest.raises(LimitError, match=r"/proc is on a file system without a block device"):
        bench_limits.block_device("/proc")
