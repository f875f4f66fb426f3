"""Live input verdicts of ``headwater train``: is the run held back by its input?

Owns: :data:`VERDICTS`, the bands (:data:`OK_WAIT_SHARE`,
:data:`HIGH_WAIT_SHARE`, :func:`dominance_band`), :func:`classify` and
:class:`VerdictTracker` (per step, cheaply: exponential moving averages of
three numbers the step already has; over the run: totals after warm-up; plus
the headspace figure).

Inputs, all from the reduced telemetry of the step (so every rank's wait
counts, not only rank 0's): ``queue/wait_seconds`` (the cluster SUM of the
time consumers blocked on their batch queue), its ``_max`` (the worst rank)
and ``_argmax_rank`` (which rank), and the step's wall time (the same on
every rank: the step is synchronous).

* ``ok``: the worst rank waits for at most :data:`OK_WAIT_SHARE` of the step
  (TensorFlow's input-pipeline analyzer calls < 5 % not input-bound, 5–20 %
  moderately and > 20 % highly input-bound);
* ``input_straggler``: above that, and one rank holds at least
  :func:`dominance_band` of all the ranks' wait: that rank's sampler is slow
  and the others wait for it in the gradient collective (named by
  ``_argmax_rank``);
* ``input_bound``: above that, with the wait spread over the ranks: every
  sampler is too slow for the model.

Headspace: the batches/s one rank's sampler must deliver for zero wait
(``1 / (step − wait)`` of the worst rank) against the batches/s it can make
(``1 / stage/total_seconds_p50``, the median time to make one batch); > 1
means room to spare.

Must never: judge from rank 0's wait alone, or name a rank for a run that
is not input-bound.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from typing import Any

from headwater.telemetry import PREFIX

VERDICTS = ("ok", "input_bound", "input_straggler")
OK_WAIT_SHARE = 0.05
HIGH_WAIT_SHARE = 0.20
WAIT = f"{PREFIX}queue/wait_seconds"
MAKE_P50 = f"{PREFIX}stage/total_seconds_p50"
#: Weight of the newest step in the per-step moving averages.
ALPHA = 0.2


def dominance_band(world: int) -> float:
    """The share of all ranks' wait one rank must hold to be the straggler:
    halfway between an even share (``1 / world``) and all of it."""
    return 0.5 + 0.5 / max(world, 1)


def classify(
    wait_max: float, wait_sum: float, step_s: float, rank: int, world: int
) -> tuple[str, int, str]:
    """``(verdict, culprit rank or -1, reason)`` from one window's totals."""
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
    return (
        "input_bound",
        -1,
        f"{level} input-bound: the worst rank waits {100 * share:.1f}% of the step "
        f"(> 5%), spread over the ranks: the samplers are too slow for the model",
    )


class VerdictTracker:
    """The verdict per step (moving averages) and over the run (totals)."""

    def __init__(self, world: int, warmup_steps: int) -> None:
        self.world, self.warmup = world, warmup_steps
        self.ema: list[float] | None = None
        self.steps = 0
        self.totals = [0.0, 0.0, 0.0]  # wait_max, wait_sum, step seconds after warm-up
        self.culprits: collections.Counter[int] = collections.Counter()
        self.make_s: list[float] = []
        self.current: tuple[str, int, str] = ("ok", -1, "no step yet")
        #: The latest per-batch make time (``stage/total_seconds_p50``).
        self.make_now = math.nan

    def headspace_now(self) -> float:
        """The headspace ratio of the moving averages: batches/s the sampler
        makes over the batches/s the step needs for zero wait (NaN before
        both are known)."""
        if self.ema is None or not self.make_now > 0:
            return math.nan
        wait_max, _, step_s = self.ema
        compute = step_s - wait_max
        return compute / self.make_now if compute > 0 else math.nan

    def observe(self, reduced: Mapping[str, float], step_s: float) -> tuple[str, int, str]:
        """Fold in one step; returns the step's verdict."""
        wait_sum = float(reduced.get(WAIT, 0.0))
        wait_max = float(reduced.get(f"{WAIT}_max", wait_sum))
        rank = int(reduced.get(f"{WAIT}_argmax_rank", 0))
        x = [wait_max, wait_sum, step_s]
        self.ema = (
            x
            if self.ema is None
            else [ALPHA * a + (1 - ALPHA) * b for a, b in zip(x, self.ema, strict=True)]
        )
        self.steps += 1
        if self.steps > self.warmup:
            self.totals = [a + b for a, b in zip(self.totals, x, strict=True)]
            if wait_max > 0:
                self.culprits[rank] += 1
            make = reduced.get(MAKE_P50)
            if make is not None and math.isfinite(make) and make > 0:
                self.make_s.append(float(make))
        make_now = reduced.get(MAKE_P50)
        if make_now is not None and math.isfinite(make_now) and make_now > 0:
            self.make_now = float(make_now)
        self.current = classify(self.ema[0], self.ema[1], self.ema[2], rank, self.world)
        return self.current

    def summary(self, replayed_steps_per_second: float = math.nan) -> dict[str, Any]:
        """The run's verdict (after warm-up) and its headspace.

        ``replayed_steps_per_second``: the step rate measured with the
        sampler removed (a cached batch replayed, :meth:`Trainer.replay_rate`),
        the batches/s a sampler must deliver for zero wait; without it, the
        run's own steps less their wait stand in."""
        wait_max, wait_sum, step_s = self.totals
        rank = self.culprits.most_common(1)[0][0] if self.culprits else 0
        verdict, culprit, reason = classify(wait_max, wait_sum, step_s, rank, self.world)
        n = max(self.steps - self.warmup, 0)
        need = n / (step_s - wait_max) if n and step_s > wait_max else math.nan
        measured = "replayed" if replayed_steps_per_second > 0 else "steps less their wait"
        if replayed_steps_per_second > 0:
            need = replayed_steps_per_second
        make = sorted(self.make_s)[len(self.make_s) // 2] if self.make_s else math.nan
        can = 1.0 / make if make > 0 else math.nan
        return {
            "verdict": verdict,
            "verdict_rank": culprit,
            "verdict_reason": reason,
            "headspace": {
                "needed_batches_per_second": need,
                "sampler_batches_per_second": can,
                "ratio": can / need if need > 0 else math.nan,
                "needed_from": measured,
            },
        }
