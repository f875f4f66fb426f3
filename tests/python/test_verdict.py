"""The input verdict (:mod:`headwater.train.verdict`) on synthetic steps.

Each step is what the trainer feeds the tracker: the step's wall time (the
summary's phases), this rank's own wait, and the reduced telemetry (the
cluster wait, its max and argmax, the median batch make time). The host load
is injected, so the tests do not depend on the machine they run on.
"""

from __future__ import annotations

import math

import pytest

from headwater.train.verdict import (
    AMPLIFICATION,
    BLOCKED,
    BUILD,
    FAULTS,
    IO_BLOCKED_SHARE,
    MAKE_P50,
    RESIDENT,
    RUNQUEUE,
    STARVED_HEADROOM,
    STARVED_RUNQUEUE_SHARE,
    VERDICTS,
    WAIT,
    VerdictTracker,
    classify,
    steady_start,
    suggested_windows,
)

WARMUP = 3


def tracker(world: int = 1, load: float = 0.2, window: int = 20) -> VerdictTracker:
    return VerdictTracker(world, WARMUP, window, load=lambda: load)


def feed(
    t: VerdictTracker,
    step_s: float,
    wait: float,
    make_s: float = 1e-3,
    world: int = 1,
    kernel: dict[str, float] | None = None,
) -> list[str]:
    """One step (flush included), as the loop does it; returns the live
    verdict. ``kernel``: the building threads' reduced kernel counters."""
    reduced = {WAIT: wait * world, f"{WAIT}_max": wait, f"{WAIT}_argmax_rank": 0, MAKE_P50: make_s}
    reduced.update(kernel or {})
    t.observe(reduced, step_s / 10, wait)  # the dispatch only, as observed mid-step
    t.add_seconds(step_s / 2)  # the flush
    t.settle(step_s)  # the step's wall time, as the summary adds it up
    return [t.live()[0]]


def test_input_bound_fires_when_the_steady_wait_is_high() -> None:
    t = tracker()
    live = [v for _ in range(30) for v in feed(t, 0.1, 0.03, make_s=0.05)]
    assert live[:WARMUP] == ["ok"] * WARMUP  # warm-up is not judged
    assert set(live[WARMUP:]) == {"input_bound"}
    s = t.summary()
    assert s["verdict"] == "input_bound" and s["verdict_wait_share"] == pytest.approx(0.3)
    assert "highly input-bound" in s["verdict_reason"]


def test_quiet_when_only_warm_up_steps_waited() -> None:
    t = tracker()
    # Compilation: long waits and long steps in the first WARMUP steps.
    live = [v for _ in range(WARMUP) for v in feed(t, 5.0, 4.0)]
    live += [v for _ in range(20) for v in feed(t, 0.1, 0.001)]
    assert live == ["ok"] * len(live)
    s = t.summary()
    assert s["verdict"] == "ok" and s["verdict_steps"] == 20
    assert s["verdict_wait_share"] == pytest.approx(0.01)


def test_a_healthy_run_never_flips_after_warm_up() -> None:
    """Dispatch-only steps with the device time in every 10th (the flush):
    the verdict judged the dispatch time alone and flipped; the live window
    holds whole log windows and the steps' real times, read at the flush
    (where the loop logs the window's rows)."""
    t = tracker(window=20)
    live = []
    for i in range(200):
        step_s = 0.3 if i % 10 == 9 else 0.003
        reduced = {WAIT: 0.0005, f"{WAIT}_max": 0.0005, MAKE_P50: 1e-4}
        t.observe(reduced, step_s, 0.0005)
        if i % 10 == 9:
            live += [t.live()[0]] * 10
    assert live == ["ok"] * 200
    assert t.summary()["verdict"] == "ok"


def test_the_summary_share_is_the_verdicts_share() -> None:
    """One process: the verdict's share is the summary's data wait share, step
    for step: the same steady steps, the same times, the same waits."""
    from headwater.train.summary import RunLog, summarise

    t, log = tracker(), RunLog()
    for i in range(12):
        wait = 0.5 if i < WARMUP else 0.002 * (i % 3)
        phases = (wait, 0.001, 0.05, 0.001, 0.002)
        log.record_phases(phases)
        log.losses.append(1.0)
        t.observe({MAKE_P50: 1e-3}, 0.01, wait)
        t.settle(sum(phases))
    s = summarise(log, warmup_steps=WARMUP, world=1, wall=1.0, **t.summary())
    assert s["data_wait_share"] == pytest.approx(s["verdict_wait_share"], rel=1e-12)
    assert s["steady_steps"] == s["verdict_steps"] == 12 - WARMUP
    assert steady_start(WARMUP, 12) == WARMUP and steady_start(WARMUP, 2) == 1


def test_cpu_starved_when_a_fast_sampler_waits_on_an_overloaded_host() -> None:
    """Wait 30 %, but the median batch takes 1 ms against 70 ms of compute
    (x70 headroom) and the host runs 2.7 runnable threads per core."""
    t = tracker(load=2.7)
    live = [v for _ in range(30) for v in feed(t, 0.1, 0.03, make_s=1e-3)]
    assert set(live[WARMUP:]) == {"cpu_starved"}
    s = t.summary()
    assert s["verdict"] == "cpu_starved" and s["verdict_rank"] == -1
    assert "overloaded" in s["verdict_reason"] and "x70" in s["verdict_reason"]
    from headwater.train.summary import RunLog, _warnings

    assert "free CPU" in _warnings(RunLog(), 0.3, "cpu_starved")[0]


@pytest.mark.parametrize(
    ("make_s", "load", "expected"),
    [
        (1e-3, 0.3, "input_bound"),  # headroom, a quiet host: a slow tail, not starvation
        (0.05, 2.7, "input_bound"),  # loaded host, but the sampler is slow too
        (0.07 / STARVED_HEADROOM, 1.0, "cpu_starved"),  # both at their bands
        (1e-3, math.nan, "input_bound"),  # no load average: never blame the host
    ],
)
def test_cpu_starved_needs_both_headroom_and_load(
    make_s: float, load: float, expected: str
) -> None:
    t = tracker(load=load)
    for _ in range(30):
        feed(t, 0.1, 0.03, make_s=make_s)
    assert t.summary()["verdict"] == expected


def test_a_straggler_is_named_before_the_host_is_blamed() -> None:
    """One rank holds the wait: input_straggler even on a loaded host."""
    v, rank, _ = classify(0.3, 0.31, 1.0, 1, 2, headroom=50.0, load=3.0)
    assert (v, rank) == ("input_straggler", 1)


def test_the_codes_keep_their_order() -> None:
    """New verdicts are appended: logged codes of old runs stay valid."""
    assert VERDICTS[:3] == ("ok", "input_bound", "input_straggler")
    assert VERDICTS.index("cpu_starved") == 3
    assert VERDICTS.index("io_bound") == 4


def _kernel(build: float, runq: float, blocked: float, faults: float) -> dict[str, float]:
    return {BUILD: build, RUNQUEUE: runq, BLOCKED: blocked, FAULTS: faults}


@pytest.mark.parametrize(
    ("kernel", "wait", "expected"),
    [
        # Blocked 80 % of the build taking faults: the disk.
        (_kernel(0.05, 0.002, 0.04, 120), 0.03, "io_bound"),
        # A cold cache on a loaded host (the cold_cache diag at load 12):
        # blocked 15 %, runnable 72 %, faults: the faults are the cause.
        (_kernel(2.18, 1.56, 0.33, 12429), 0.03, "io_bound"),
        # Runnable but not running 40 % of the build: a starved host, on a quiet
        # load average (the kernel's account needs no load figure).
        (_kernel(0.05, 0.02, 0.005, 0), 0.03, "cpu_starved"),
        # Runnable and blocked, but no fault: a lock, not the disk.
        (_kernel(0.05, 0.028, 0.02, 0), 0.03, "cpu_starved"),
        # Blocked without faults (a lock, a sleep): not the disk.
        (_kernel(0.05, 0.0, 0.045, 0), 0.03, "input_bound"),
        # Just under the bands: a slow sampler.
        (
            _kernel(1.0, STARVED_RUNQUEUE_SHARE - 0.01, IO_BLOCKED_SHARE - 0.01, 9),
            0.03,
            "input_bound",
        ),
        # No wait: ok, whatever the kernel says.
        (_kernel(0.05, 0.03, 0.04, 120), 0.001, "ok"),
    ],
)
def test_io_bound_and_cpu_starved_from_the_kernels_account(
    kernel: dict[str, float], wait: float, expected: str
) -> None:
    t = tracker(load=0.2)
    live = [v for _ in range(30) for v in feed(t, 0.1, wait, make_s=0.05, kernel=kernel)]
    assert set(live[WARMUP:]) == {expected}
    s = t.summary()
    assert s["verdict"] == expected
    if expected == "io_bound":
        assert "major page faults" in s["verdict_reason"]
        from headwater.train.summary import RunLog, _warnings

        assert "page cache" in _warnings(RunLog(), 0.3, "io_bound")[0]


def test_the_suggested_windows_grow_with_what_does_not_fit() -> None:
    assert suggested_windows(3 * 2**30, 2**30) == 64
    assert suggested_windows(100 * 2**30, 2**30) == 2048
    assert suggested_windows(2**40, 2**30) == 16384


def test_an_io_bound_verdict_names_its_cause_and_fix() -> None:
    """A corpus larger than the memory budget is told so, with the remedies
    that help; one that fits is told to warm the cache or stage it."""
    disk = _kernel(0.05, 0.002, 0.04, 120)
    reasons = {}
    for name, memory in {"over": (3 * 2**30, 2**30), "fits": (2**29, 2**30), "unknown": None}.items():
        t = tracker(load=0.2)
        t.memory = memory
        for _ in range(30):
            feed(t, 0.1, 0.03, make_s=0.05, kernel=disk)
        s = t.summary()
        assert s["verdict"] == "io_bound"
        reasons[name] = s["verdict_reason"]
    assert "map 3.00 GiB against a memory budget of 1.00 GiB" in reasons["over"], reasons
    assert "stage_dir" in reasons["over"] and "more memory" in reasons["over"]
    assert "--row-order locality and set seed_windows = 64" in reasons["over"]
    assert "fit its memory" in reasons["fits"] and "populate" in reasons["fits"], reasons
    assert reasons["unknown"] == reasons["fits"]


def _io_reason(memory: tuple[int, int | None] | None, resident: float, amplification: float) -> str:
    """The reason of an io_bound run whose steps report these I/O figures."""
    disk = {**_kernel(0.05, 0.002, 0.04, 120), RESIDENT: resident, AMPLIFICATION: amplification}
    t = tracker(load=0.2)
    t.memory = memory
    for _ in range(30):
        feed(t, 0.1, 0.03, make_s=0.05, kernel=disk)
    s = t.summary()
    assert s["verdict"] == "io_bound"
    return str(s["verdict_reason"])


def test_the_io_bound_reason_states_the_working_set_figures_and_their_cause() -> None:
    """The window's residency and read amplification are quoted and choose
    the cause: a working set larger than the budget (more memory, a
    stretch at a time), cold storage (populate, staging, faster storage),
    or a resident working set that still faults (eviction, read-ahead)."""
    over = _io_reason((3 * 2**30, 2**30), 0.25, 37.0)
    assert over.count("25% of the pages its batches were about to read") == 1, over
    assert "read 37.0 bytes from storage per byte its batches used" in over
    assert "working set does not fit the memory budget" in over
    assert "memory_budget" in over and "seed_windows = 64" in over
    assert f"hot_set_bytes = {2**29}" in over
    cold = _io_reason((2**29, 2**30), 0.1, 60.0)
    assert "10% of the pages" in cold and "not in the page cache" in cold, cold
    assert "populate" in cold and "stage_dir" in cold and "faster storage" in cold
    assert "--row-order locality" in cold  # 60 bytes per byte used: read-ahead waste
    resident = _io_reason((2**29, 2**30), 0.95, 1.5)
    assert "95% of the pages" in resident and "evicted" in resident, resident
    assert "--row-order locality" not in resident  # 1.5 bytes per byte: no waste
    # Figures change the words, not the cause, when the budget is exceeded.
    assert "does not fit" in _io_reason((3 * 2**30, 2**30), 0.99, 0.5)
