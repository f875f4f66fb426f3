"""Live input verdicts of ``headwater train``: is the run held back by its input?

Owns: :data:`VERDICTS`, the bands (:data:`OK_WAIT_SHARE`,
:data:`HIGH_WAIT_SHARE`, :func:`dominance_band`, :data:`STARVED_HEADROOM`,
:data:`STARVED_RUNQUEUE_SHARE`, :data:`IO_BLOCKED_SHARE`), :class:`Kernel`,
:func:`steady_start` (where the steady state begins: the one definition the
summary's timings use too), :func:`classify` and :class:`VerdictTracker` (one
record per step; the live verdict over a trailing window of steady steps, the
run's verdict over all of them, plus the headspace figure).

Inputs per step: the step's wall time as the run summary times it (the sum
of its phases, device time included: :class:`~headwater.train.summary.RunLog`),
this rank's own sample wait (the ``sample_wait`` phase), and from the reduced
telemetry of the step (so every rank's wait counts, not only rank 0's)
``queue/wait_seconds`` (the cluster SUM of the time consumers blocked on their
batch queue), its ``_max`` (the worst rank), ``_argmax_rank`` and the median
time to make one batch (``stage/total_seconds_p50``).

Why the window matters: the step only dispatches work to the device; the
device time lands in the step that brings the metrics to the host (every
``log_every`` steps). A verdict judged per step on the dispatch time alone
saw a 5 ms "step" where the run summary saw 340 ms, and called a run that
waited 0.4 % of its time input-bound. Every verdict here divides by the same
step times the summary adds up, over the same steps (after
:func:`steady_start`): the run's verdict and the summary's
``data_wait_share`` cannot disagree (with one process they are the same
number; with more, the verdict's is the worst rank's, never below it).

* ``ok``: the worst rank waits for at most :data:`OK_WAIT_SHARE` of the step
  (TensorFlow's input-pipeline analyzer calls < 5 % not input-bound, 5–20 %
  moderately and > 20 % highly input-bound);
* ``input_straggler``: above that, and one rank holds at least
  :func:`dominance_band` of all the ranks' wait: that rank's sampler is slow
  and the others wait for it in the gradient collective (named by
  ``_argmax_rank``);
* ``cpu_starved``: above that, spread over the ranks, but the samplers are
  not slow: the median batch is made :data:`STARVED_HEADROOM` times faster
  than the step consumes them, and the host has more runnable threads than
  cores (1-minute load average per core ≥ 1). A sampler that makes a batch
  in a quarter of the step's compute time and has a queue to fill cannot
  keep the consumer waiting on its own: when it does, its threads are
  runnable but not running (the host is overloaded) — adding sampler
  threads or prefetch, the advice for ``input_bound``, makes it worse. Both
  conditions are required: headroom alone also describes a sampler whose
  median is fast but whose tail is slow (that *is* input-bound), and load
  alone describes a busy host whose sampler still keeps up;
  The kernel's own account says the same more directly: the building
  threads' run-queue time (``cpu/runqueue_seconds``, schedstat field 2:
  runnable, not running) over their build time (``cpu/build_seconds``) at
  :data:`STARVED_RUNQUEUE_SHARE` or more is ``cpu_starved`` on its own
  (unless the sampler is ``io_bound``);
* ``io_bound`` (judged before ``cpu_starved``): above that, and the building
  threads spent at least :data:`IO_BLOCKED_SHARE` of their build time
  blocked off the CPU (``io/blocked_seconds``: neither running nor
  runnable) while taking major page faults (``io/major_faults`` > 0): the
  sampler waits for the disk (a database larger than the page cache, a cold
  cache) — more threads or prefetch help little. :func:`io_remedy` names
  which of the two it is and its fix from the read plan (the databases'
  mapped bytes against the memory budget) and two figures of the window:
  the share of the working set the page cache held
  (``io/working_set_resident``) and the bytes read per byte used
  (``io/read_amplification``). Why first: a thread
  that blocks on every fault is put back behind the busy threads after each
  one, so on a loaded host a cold cache also shows as run-queue time
  (measured: the ``cold_cache`` diag at load ~12 on 2 cores spent 15 % of
  its build time blocked and 72 % runnable over 300 faults a batch); the
  faults are the cause to fix;
* ``input_bound``: otherwise: every sampler is too slow for the model.

Headspace: the batches/s one rank's sampler must deliver for zero wait
(``1 / (step − wait)`` of the worst rank) against the batches/s it can make
(``1 / stage/total_seconds_p50``); > 1 means room to spare.

Must never: judge from rank 0's wait alone, name a rank for a run that is not
input-bound, or judge a warm-up step (compilation is not input).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from headwater.telemetry import PREFIX

#: The verdict codes (``trainer/verdict`` logs the index; the exporter's
#: help text in ``crates/telemetry/src/table.rs`` lists the same).
VERDICTS = ("ok", "input_bound", "input_straggler", "cpu_starved", "io_bound")
OK_WAIT_SHARE = 0.05
HIGH_WAIT_SHARE = 0.20
#: How many times faster than the step needs the sampler must make batches
#: for a wait to be blamed on the host, not the sampler.
STARVED_HEADROOM = 4.0
#: Runnable threads per core (1-minute load average) that mark a host overloaded.
STARVED_LOAD_PER_CORE = 1.0
#: Run-queue time over build time of the sampler threads that marks them starved.
STARVED_RUNQUEUE_SHARE = 0.25
#: Blocked (off-CPU, not runnable) time over build time that, with major
#: faults, marks the sampler I/O-bound (a warm sampler blocks ~0 %).
IO_BLOCKED_SHARE = 0.1
#: Steady steps the live verdict looks back over (at least one log window).
LIVE_WINDOW = 20
WAIT = f"{PREFIX}queue/wait_seconds"
MAKE_P50 = f"{PREFIX}stage/total_seconds_p50"
BUILD = f"{PREFIX}cpu/build_seconds"
RUNQUEUE = f"{PREFIX}cpu/runqueue_seconds"
BLOCKED = f"{PREFIX}io/blocked_seconds"
FAULTS = f"{PREFIX}io/major_faults"
RESIDENT = f"{PREFIX}io/working_set_resident"
AMPLIFICATION = f"{PREFIX}io/read_amplification"


def _band(metric: str) -> tuple[float, float]:
    """The healthy band of a metric-table row (the row owns it)."""
    from headwater import _native

    row = next(r for r in _native.metric_table() if r["key"] == metric)
    band = row["healthy"]
    if band is None:
        raise ValueError(f"{metric!r} has no healthy band")
    return band["lo"], math.inf if band["hi"] is None else band["hi"]


@dataclasses.dataclass(frozen=True)
class Kernel:
    """What the kernel counted for the building threads over a window
    (cluster sums, seconds): build wall time, run-queue wait, blocked time
    and major faults."""

    build_s: float = 0.0
    runqueue_s: float = 0.0
    blocked_s: float = 0.0
    faults: float = 0.0
    #: The worst rank's share of the probed working set in the page cache,
    #: and its bytes read per byte used (NaN: not reported).
    resident: float = math.nan
    amplification: float = math.nan

    @property
    def runqueue_share(self) -> float:
        return self.runqueue_s / self.build_s if self.build_s > 0 else 0.0

    @property
    def blocked_share(self) -> float:
        return self.blocked_s / self.build_s if self.build_s > 0 else 0.0


def steady_start(warmup_steps: int, steps: int) -> int:
    """The first steady step of a run of ``steps``: after the warm-up
    (compilation), but never past the last step."""
    return min(warmup_steps, max(0, steps - 1))


def host_load() -> float:
    """The 1-minute load average per core (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return math.nan


def dominance_band(world: int) -> float:
    """The share of all ranks' wait one rank must hold to be the straggler:
    halfway between an even share (``1 / world``) and all of it."""
    return 0.5 + 0.5 / max(world, 1)


def classify(
    wait_max: float,
    wait_sum: float,
    step_s: float,
    rank: int,
    world: int,
    headroom: float = math.nan,
    load: float = math.nan,
    kernel: Kernel | None = None,
    memory: tuple[int, int | None] | None = None,
) -> tuple[str, int, str]:
    """``(verdict, culprit rank or -1, reason)`` from one window's totals;
    ``headroom``: batches/s the sampler makes over those the step needs;
    ``load``: runnable threads per core; ``memory``: the databases' mapped
    bytes and the memory budget (:func:`io_remedy`); ``kernel``: what the kernel counted
    for the building threads."""
    share = wait_max / step_s if step_s > 0 else 0.0
    if not share > OK_WAIT_SHARE:
        return "ok", -1, f"worst rank waits {100 * share:.1f}% of the step (<= 5%)"
    level = "highly" if share > HIGH_WAIT_SHARE else "moderately"
    held = wait_max / wait_sum if wait_sum > 0 else 1.0
    if world > 1 and held >= dominance_band(world):
        return (
            "input_straggler",
            rank,
            f"rank {rank} waits {100 * share:.1f}% of the step and holds {100 * held:.0f}% of "
            f"all ranks' wait: its sampler is slow, the others wait for it",
        )
    k = kernel or Kernel()
    runq, blocked = k.runqueue_share, k.blocked_share
    if blocked >= IO_BLOCKED_SHARE and k.faults > 0:
        return (
            "io_bound",
            -1,
            f"the worst rank waits {100 * share:.1f}% of the step, and the sampler threads "
            f"were blocked off the CPU {100 * blocked:.0f}% of their build time "
            f"(>= {100 * IO_BLOCKED_SHARE:.0f}%) taking {k.faults:.0f} major page faults: "
            f"the sampler waits for the disk; {io_remedy(memory, k.resident, k.amplification)}",
        )
    if runq >= STARVED_RUNQUEUE_SHARE:
        return (
            "cpu_starved",
            -1,
            f"the worst rank waits {100 * share:.1f}% of the step, and the sampler threads "
            f"were runnable but not running {100 * runq:.0f}% of their build time "
            f"(>= {100 * STARVED_RUNQUEUE_SHARE:.0f}%): the host is overloaded, not the sampler "
            "slow; free CPU rather than add sampler threads",
        )
    if headroom >= STARVED_HEADROOM and load >= STARVED_LOAD_PER_CORE:
        return (
            "cpu_starved",
            -1,
            f"the worst rank waits {100 * share:.1f}% of the step, but the sampler makes "
            f"batches x{headroom:.1f} faster than the step needs and the host runs "
            f"{load:.1f} runnable threads per core: the host is overloaded, not the sampler slow",
        )
    return (
        "input_bound",
        -1,
        f"{level} input-bound: the worst rank waits {100 * share:.1f}% of the step "
        f"(> 5%), spread over the ranks: the samplers are too slow for the model",
    )


@dataclasses.dataclass
class StepRecord:
    """One step as the verdict sees it."""

    step_s: float
    wait_max: float
    wait_sum: float
    rank: int
    make_s: float
    load: float
    kernel: Kernel = dataclasses.field(default_factory=Kernel)


def suggested_windows(mapped: int, budget: int) -> int:
    """A ``seed_windows`` for databases mapping ``mapped`` bytes read from a
    budget of ``budget``: a window at most 1/16 of the budget, a power of two,
    at least 64 (on TPC-H SF 1 in 600 MiB, 64 to 1024 windows read alike)."""
    need = 16 * mapped / max(budget, 1)
    return int(max(64, 2 ** math.ceil(math.log2(max(need, 1.0)))))


def io_figures(resident: float, amplification: float) -> str:
    """The window's two I/O figures in words (empty when neither is known)."""
    parts = []
    if math.isfinite(resident):
        parts.append(
            f"{100 * resident:.0f}% of the pages its batches were about to read were in the page cache"
        )
    if math.isfinite(amplification):
        parts.append(f"it read {amplification:.1f} bytes from storage per byte its batches used")
    return f"{' and '.join(parts)}: " if parts else ""


def io_remedy(
    memory: tuple[int, int | None] | None,
    resident: float = math.nan,
    amplification: float = math.nan,
) -> str:
    """The cause of an ``io_bound`` sampler and its fix, from the mapped
    bytes of its databases and its memory budget (``memory_budget``, else
    the memory cgroup's limit or the host's memory; page cache included),
    the share of its working set the page cache held (``resident``) and the
    bytes it read per byte used (``amplification``; NaN: unknown).

    * the databases map more than the budget: the working set does not fit
      (raise the memory, or read a stretch at a time);
    * they fit but the working set was not resident (below the
      ``io/working_set_resident`` band): cold or remote storage (warm the
      cache, stage, faster storage);
    * they fit and the working set was resident: what faults is read-ahead
      or eviction by others (the same cures, said so);
    * nothing known: the cold-storage advice, the common case.
    """
    gib = 2.0**30
    mapped, budget = memory or (0, None)
    figures = io_figures(resident, amplification)
    lo_resident = _band("io/working_set_resident")[0]
    hi_amplification = _band("io/read_amplification")[1]
    wasteful = math.isfinite(amplification) and amplification > hi_amplification
    waste = (
        "; read-ahead and whole pages bring in what no batch uses, which a locality row order "
        "(preprocess --row-order locality) cuts"
        if wasteful
        else ""
    )
    if budget and mapped > budget:
        return (
            f"{figures}the working set does not fit the memory budget: its databases map "
            f"{mapped / gib:.2f} GiB against a memory budget of {budget / gib:.2f} GiB (page "
            "cache included), so the page cache cannot hold them: give the run more memory (its "
            "memory cgroup, and memory_budget if set below it), or read them a stretch at a "
            "time (preprocess with --row-order locality and set "
            f"seed_windows = {suggested_windows(mapped, budget)}); for a mixture of many "
            f"databases, train on a few at a time (hot_set_bytes = {budget // 2} or less, "
            "hot_set_steps); or move them to faster storage (stage_dir on a local disk); "
            "more sampler threads will not help"
        )
    if math.isfinite(resident) and resident >= lo_resident:
        return (
            f"{figures}its databases fit its memory and most of what the batches read was "
            "cached, yet the building threads fault: pages are evicted between reads (another "
            "process's memory, a cgroup limit below the host's) or read-ahead fetches more than "
            "is used; warm and hold them (page_cache = \"populate\" or \"mlock\") or copy "
            f"them to a local disk (stage_dir){waste}"
        )
    return (
        f"{figures}its databases fit its memory but are not in the page cache (a cold start, "
        "or remote storage whose client cache evicts them): warm it (page_cache = "
        "\"populate\"), copy them to a local disk (stage_dir) or move them to faster storage "
        f"rather than add threads{waste}"
    )


def _median_of(xs: Sequence[float]) -> float:
    """The median of the finite values of ``xs`` (NaN for none)."""
    xs = sorted(x for x in xs if math.isfinite(x))
    return xs[len(xs) // 2] if xs else math.nan


def _median(xs: Sequence[float]) -> float:
    xs = sorted(x for x in xs if x > 0)
    return xs[len(xs) // 2] if xs else math.nan


class VerdictTracker:
    """The verdict of a trailing window of steady steps (live) and of all of
    them (the run's): one :class:`StepRecord` per step."""

    def __init__(
        self,
        world: int,
        warmup_steps: int,
        window: int = LIVE_WINDOW,
        load: Callable[[], float] = host_load,
    ) -> None:
        self.world, self.warmup, self.window, self.load = world, warmup_steps, window, load
        self.records: list[StepRecord] = []
        #: The databases' mapped bytes and the memory budget, when known.
        self.memory: tuple[int, int | None] | None = None

    def observe(self, reduced: Mapping[str, float], step_s: float, own_wait: float = 0.0) -> None:
        """Fold in one step: its wall time so far, this rank's own sample
        wait and the reduced telemetry (:meth:`settle` corrects the time once
        the step is over)."""
        wait_sum = float(reduced.get(WAIT, 0.0))
        wait_max = float(reduced.get(f"{WAIT}_max", wait_sum))
        if self.world == 1:  # the worst rank is this one: its own, exact wait
            wait_max = wait_sum = own_wait
        else:
            wait_max = max(wait_max, own_wait)
            wait_sum = max(wait_sum, wait_max)
        make = float(reduced.get(MAKE_P50, math.nan))
        rank = int(reduced.get(f"{WAIT}_argmax_rank", 0))
        build, runq, blocked, faults = (
            float(reduced.get(key, 0.0)) for key in (BUILD, RUNQUEUE, BLOCKED, FAULTS)
        )
        kernel = Kernel(
            build,
            runq,
            blocked,
            faults,
            float(reduced.get(RESIDENT, math.nan)),
            float(reduced.get(AMPLIFICATION, math.nan)),
        )
        self.records.append(
            StepRecord(step_s, wait_max, wait_sum, rank, make, self.load(), kernel)
        )

    def read_plan_of(self, sampler: Any) -> None:
        """The sampler's read plan (``database_metadata()["memory"]``): its
        databases' mapped bytes and memory budget, for :func:`io_remedy`."""
        meta: dict[str, Any] = getattr(sampler, "database_metadata", dict)()
        mem = meta.get("memory", {})
        self.memory = (int(mem.get("mapped_bytes") or 0), mem.get("budget_bytes"))

    def add_seconds(self, dt: float) -> None:
        """Time spent in the latest step after it was observed (the flush)."""
        if self.records:
            self.records[-1].step_s += dt

    def settle(self, step_s: float) -> None:
        """The latest step's wall time, as the summary records it."""
        if self.records:
            self.records[-1].step_s = step_s

    def steady(self) -> list[StepRecord]:
        return self.records[steady_start(self.warmup, len(self.records)) :]

    def judge(self, recs: Sequence[StepRecord]) -> tuple[str, int, str]:
        """The verdict of ``recs`` (``ok`` for none: warm-up is not judged)."""
        if not recs:
            return "ok", -1, "warm-up: not judged"
        wait_max = sum(r.wait_max for r in recs)
        wait_sum = sum(r.wait_sum for r in recs)
        step_s = sum(r.step_s for r in recs)
        ranks = collections.Counter(r.rank for r in recs if r.wait_max > 0)
        rank = ranks.most_common(1)[0][0] if ranks else 0
        loads = [r.load for r in recs if math.isfinite(r.load)]
        load = sorted(loads)[len(loads) // 2] if loads else math.nan
        kernel = Kernel(
            sum(r.kernel.build_s for r in recs),
            sum(r.kernel.runqueue_s for r in recs),
            sum(r.kernel.blocked_s for r in recs),
            sum(r.kernel.faults for r in recs),
            _median_of([r.kernel.resident for r in recs]),
            _median_of([r.kernel.amplification for r in recs]),
        )
        return classify(
            wait_max, wait_sum, step_s, rank, self.world, _headroom(recs), load, kernel,
            self.memory,
        )

    def live(self) -> tuple[str, int, str]:
        """The verdict of the last :attr:`window` steady steps."""
        if len(self.records) <= self.warmup:
            return "ok", -1, "warm-up: not judged"
        return self.judge(self.steady()[-self.window :])

    def headspace_now(self) -> float:
        """The headspace ratio of the live window (NaN before it is known)."""
        if len(self.records) <= self.warmup:
            return math.nan
        return _headroom(self.steady()[-self.window :])

    def summary(self, replayed_steps_per_second: float = math.nan) -> dict[str, Any]:
        """The run's verdict (the steady steps: the summary's window) and its headspace.

        ``replayed_steps_per_second``: the step rate measured with the
        sampler removed (a cached batch replayed, :meth:`Trainer.replay_rate`),
        the batches/s a sampler must deliver for zero wait; without it, the
        run's own steps less their wait stand in."""
        recs = self.steady()
        verdict, culprit, reason = self.judge(recs)
        step_s = sum(r.step_s for r in recs)
        wait_max = sum(r.wait_max for r in recs)
        need = len(recs) / (step_s - wait_max) if recs and step_s > wait_max else math.nan
        measured = "replayed" if replayed_steps_per_second > 0 else "steps less their wait"
        if replayed_steps_per_second > 0:
            need = replayed_steps_per_second
        can = 1.0 / _median([r.make_s for r in recs])
        return {
            "verdict": verdict,
            "verdict_rank": culprit,
            "verdict_reason": reason,
            "verdict_wait_share": wait_max / step_s if step_s > 0 else 0.0,
            "verdict_steps": len(recs),
            "headspace": {
                "needed_batches_per_second": need,
                "sampler_batches_per_second": can,
                "ratio": can / need if need > 0 else math.nan,
                "needed_from": measured,
            },
        }


def _headroom(recs: Sequence[StepRecord]) -> float:
    """Batches/s the sampler makes (median make time) over the batches/s the
    step needs for zero wait (its time less the worst rank's wait)."""
    make = _median([r.make_s for r in recs])
    compute = sum(r.step_s - r.wait_max for r in recs) / max(len(recs), 1)
    return compute / make if make > 0 and compute > 0 else math.nan


def replayed_rate(train_fn: Any, args: tuple[Any, ...], steps: int = 8) -> float:
    """Steps/s of the train step fed the same batch again and again, the
    sampler out of the loop (SPDL's headspace method): the batches/s a
    sampler must deliver for zero wait. ``args``: ``(params, opt_state,
    batch, col, cat)``; the results are discarded (the parameters are not
    donated, so they are untouched); every rank replays the same number of
    steps, so the collectives pair up."""
    import jax

    p, o, *rest = args
    jax.block_until_ready(train_fn(p, o, *rest))  # compiled
    t0 = time.perf_counter()
    for _ in range(steps):
        p, o, m = train_fn(p, o, *rest)
    jax.block_until_ready((p, o, m))
    return steps / (time.perf_counter() - t0)
