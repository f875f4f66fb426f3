"""The end of a training run: the per-rank summary and the lines printed.

Owns: :data:`PHASES` (the timed phases of a step), :class:`RunLog` (what the
loop records per step), :func:`summarise` (the ``rank-<r>.json`` summary:
losses, throughput, the step-time profile after warm-up, invariant warnings,
the final evaluation per split and task, every evaluation's flat row)
and :func:`format_summary`.

Must never: count warm-up steps (compilation) in throughput or timings, or
stay silent about a non-zero invariant counter.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from headwater.evaluation.evaluate import flat_row
from headwater.evaluation.scoring import format_table
from headwater.telemetry import PREFIX
from headwater.train.verdict import steady_start

#: Timed phases of a step, in order.
PHASES = ("sample_wait", "host_to_device", "compute", "telemetry", "other")
#: The reduced invariant counters the summary warns about.
INVARIANTS = (
    f"{PREFIX}invariants/duplicate_seeds",
    f"{PREFIX}invariants/temporal_leaks",
    f"{PREFIX}invariants/label_leaks",
)


@dataclasses.dataclass
class RunLog:
    """What one rank records while it trains."""

    losses: list[float] = dataclasses.field(default_factory=list)
    val_losses: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    times: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {p: [] for p in PHASES}
    )
    invariants: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(INVARIANTS, 0.0)
    )
    culprits: dict[str, set[int]] = dataclasses.field(
        default_factory=lambda: {k: set() for k in INVARIANTS}
    )
    telemetry_rows: int = 0
    #: Evaluation passes: ``{"step", "split", "full", "final", "max_seeds",
    #: "results", "sampler"}`` each.
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def record_phases(self, durations: tuple[float, ...]) -> None:
        for name, dt in zip(PHASES, durations, strict=True):
            self.times[name].append(dt)

    def record_invariants(self, reduced: Mapping[str, float]) -> None:
        for k in INVARIANTS:
            if reduced.get(k, 0.0) > 0:
                self.invariants[k] += reduced[k]
                self.culprits[k].add(int(reduced.get(f"{k}_argmax_rank", 0)))


def _warnings(log: RunLog, wait_share: float, verdict: str = "") -> list[str]:
    out = [
        f"{key.removeprefix(PREFIX)} = {int(v)} (ranks {sorted(log.culprits[key])}): "
        + (
            "a seed was drawn twice in one epoch"
            if "duplicate" in key
            else "labels not yet known at the observation time reached the model"
            if "label" in key
            else "rows dated after the observation time reached the model"
        )
        for key, v in log.invariants.items()
        if v > 0
    ]
    if wait_share > 0.05 and verdict == "cpu_starved":
        out.append(
            f"data wait is {100 * wait_share:.1f}% of step time (> 5%) on an overloaded host: "
            "the sampler keeps up when it runs; free CPU rather than add sampler threads"
        )
    elif wait_share > 0.05 and verdict == "io_bound":
        out.append(
            f"data wait is {100 * wait_share:.1f}% of step time (> 5%) and the sampler threads wait "
            "for the disk (major page faults: pages not in the page cache): the input verdict names "
            "which cause (a working set larger than the memory budget, or cold storage) and its "
            "fix; more sampler threads will not help"
        )
    elif wait_share > 0.05:
        out.append(
            f"data wait is {100 * wait_share:.1f}% of step time (> 5%): the sampler does not keep "
            "up; raise num_threads / num_prefetch"
        )
    return out


def summarise(
    log: RunLog, *, warmup_steps: int, world: int, wall: float, **extra: Any
) -> dict[str, Any]:
    """The summary of a rank's run; ``extra`` (rank, digest, config, ...) is
    copied in as is (the input verdict among them: it judges the same steady
    steps, :func:`~headwater.train.verdict.steady_start`)."""
    losses = log.losses
    warm = steady_start(warmup_steps, len(log.times["sample_wait"]))
    steady = {p: v[warm:] for p, v in log.times.items()}
    step_times = [sum(x) for x in zip(*steady.values(), strict=True)]
    total = sum(step_times)
    k = max(1, min(10, len(losses) // 5))
    wait_share = sum(steady["sample_wait"]) / total if total > 0 else 0.0
    eval_s = float(extra.pop("eval_seconds", 0.0))
    return {
        "world": world,
        "steps": len(losses),
        "losses": losses,
        # NaN (JSON NaN) when this attempt ran no step: the summary says so.
        # The first step's own loss: what the first progress line shows.
        "loss_first": losses[0] if losses else math.nan,
        "loss_start": _mean(losses[:k]),
        "loss_end": _mean(losses[-k:]),
        "loss_window": k,
        "val_losses": log.val_losses,
        "wall_seconds": wall,
        # The wall time split: validation and evaluation passes apart.
        "train_seconds": max(wall - eval_s, 0.0),
        "eval_seconds": eval_s,
        "steady_steps": len(step_times),
        "step_seconds_median": statistics.median(step_times) if step_times else math.nan,
        "batches_per_second": world * len(step_times) / total if total > 0 else math.nan,
        "data_wait_share": wait_share,
        "phase_seconds_mean": {p: _mean(v, 0.0) for p, v in steady.items()},
        "phase_share": {p: sum(v) / total if total > 0 else 0.0 for p, v in steady.items()},
        "invariants": dict(log.invariants),
        "telemetry_rows_logged": log.telemetry_rows,
        "warnings": _warnings(log, wait_share, extra.get("verdict", "")),
        # The final passes (whole splits, or capped by eval_final_max_seeds).
        "eval": {e["split"]: e["results"] for e in log.evals if e.get("final", e["full"])},
        "eval_max_seeds": next(
            (e.get("max_seeds") for e in log.evals if e.get("final", e["full"])), None
        ),
        "eval_history": [
            {
                "step": e["step"],
                "split": e["split"],
                **flat_row(e["split"], e["results"]),
                **e.get("sampler", {}),
            }
            for e in log.evals
        ],
        **extra,
    }


def _mean(values: list[float], empty: float = math.nan) -> float:
    """The mean, ``empty`` for no values (no NumPy "Mean of empty slice")."""
    return float(np.mean(values)) if values else empty


def describe_layout(layout: Mapping[str, Any]) -> str:
    """How the global batch is formed, in words."""
    text = (
        f"{layout['processes']} process(es) × {layout['local_devices']} {layout['platform']} "
        f"device(s) = {layout['devices']} · global batch {layout['global_batch']} = "
        f"{layout['per_device_batch']} per device × {layout['devices']} devices "
        f"({layout['per_process_batch']} per process, one sampler per process)"
    )
    by_length = layout.get("global_batch_by_length")
    if not by_length:
        return text
    shapes = ", ".join(f"{b}×{s}" for s, b in by_length.items())
    return (
        f"{text}; training steps draw S at {layout['tokens_per_batch']} tokens per rank: "
        f"global B×S {shapes} (the batch above is the val stream's and evaluation passes')"
    )


def _losses(s: Mapping[str, Any], start: int) -> str:
    """The first step's loss (the first progress line's), then the means of
    the first and the last steps, saying how many."""
    k = int(s.get("loss_window") or 1)
    first = s.get("loss_first", s["loss_start"])
    steps = int(s["steps"])
    text = f"{first:.4f} at step {start + 1}"
    if steps == 1:
        return text
    if k == 1:
        return f"{text} -> {s['loss_end']:.4f} at step {start + steps}"
    return f"{text}; mean of the first {k} steps {s['loss_start']:.4f} -> last {k} {s['loss_end']:.4f}"


def _headline(s: Mapping[str, Any]) -> list[str]:
    """``done: …`` (training and evaluation time apart), the loss and the
    rate: a phase that did not run says so instead of printing NaN."""
    steps, start = int(s["steps"]), int(s.get("start_step") or 0)
    train_s = s.get("train_seconds", s["wall_seconds"])
    eval_s = s.get("eval_seconds", 0.0)
    timing = f"{train_s:.1f} s training + {eval_s:.1f} s evaluation"
    if steps == 0:
        head = (
            f"done: no training steps in this attempt (resumed at step {start}, all trained); "
            f"{timing} on {s['world']} process(es)"
        )
    else:
        head = f"done: {steps} steps in {timing} on {s['world']} process(es)"
    val = s.get("final_val_loss", math.nan)
    if isinstance(val, float) and math.isfinite(val):
        val_text = f"val loss {val:.4f}"
    elif s.get("interrupted"):
        val_text = f"final validation not run (stopped by {s['interrupted']})"
    else:
        val_text = "no final validation (train.val_batches = 0)"
    lines = [head, f"  {describe_layout(s['batch_layout'])}"]
    if steps:
        lines.append(f"  loss {_losses(s, start)}; {val_text}")
    else:
        lines.append(f"  loss: no steps; {val_text}")
    if math.isfinite(s["batches_per_second"]):
        lines.append(
            f"  {s['batches_per_second']:.2f} batches/s, "
            f"median step {1e3 * s['step_seconds_median']:.1f} ms, "
            f"data wait {100 * s['data_wait_share']:.2f}% of step time"
        )
    else:
        lines.append("  throughput: no steady steps to time (warm-up only or none)")
    return lines


def _headspace(s: Mapping[str, Any]) -> str:
    hs = s["headspace"]
    if not (math.isfinite(hs["ratio"]) and math.isfinite(hs["sampler_batches_per_second"])):
        return (
            f"  input verdict: {s['verdict']} ({s['verdict_reason']}); headspace: not measured "
            f"({s.get('verdict_steps', 0)} steady steps)"
        )
    return (
        f"  input verdict: {s['verdict']} ({s['verdict_reason']}); headspace: the sampler makes "
        f"{hs['sampler_batches_per_second']:.1f} batches/s, the step needs "
        f"{hs['needed_batches_per_second']:.1f} for zero wait ({hs['needed_from']}; "
        f"x{hs['ratio']:.2f})"
    )


def format_summary(s: Mapping[str, Any], profile: bool = False) -> str:
    lines = _headline(s)
    if s.get("throughput") and math.isfinite(s["batches_per_second"]):
        from headwater.train.throughput import format_throughput

        lines.append(format_throughput(s["throughput"]))
    if profile and s["steady_steps"]:
        lines.append(
            f"  step breakdown (rank {s['rank']}, mean over {s['steady_steps']} steps "
            "after warm-up):"
        )
        for p in PHASES:
            lines.append(
                f"    {p:<15} {1e3 * s['phase_seconds_mean'][p]:9.3f} ms  "
                f"{100 * s['phase_share'][p]:6.2f}%"
            )
        pf = s.get("prefetch") or {}
        if pf:
            lines.append(
                f"  prefetch thread ({int(pf['depth'])} deep, beside the steps; the loop's "
                f"waits above): sampler {1e3 * pf['sample_seconds_mean']:.3f} ms, host → device "
                f"{1e3 * pf['host_to_device_seconds_mean']:.3f} ms per batch"
            )
    ck = s.get("checkpoint")
    if ck and ck["steps"]:
        lines.append(
            f"  checkpoints at steps {', '.join(map(str, ck['steps']))}: the loop was blocked "
            f"{sum(ck['blocked_seconds']):.2f} s in all (max {max(ck['blocked_seconds']):.2f} s "
            f"per save), {ck['final_wait_seconds']:.2f} s waiting for the last commit"
        )
    lines.append(_headspace(s))
    health = "sampler health: ok (invariant counters all 0)"
    if s["warnings"]:
        health = "sampler health: WARNING\n" + "\n".join(f"  warning: {w}" for w in s["warnings"])
    lines.append(health)
    if s.get("eval"):
        cap = s.get("eval_max_seeds")
        what = "whole splits" if cap is None else f"the first {cap} seeds of each task"
        lines.append(
            f"evaluation ({what}, union of ranks; baseline = best constant, "
            "or popularity before t for a link task):"
        )
        lines.extend("  " + x for x in format_table(s["eval"]).splitlines())
    if s["wandb_dir"]:
        lines.append(f"W&B run: {s['wandb_dir']}")
    if s["metrics_endpoints"]:
        lines.append(f"metrics were served at: {', '.join(s['metrics_endpoints'])}")
    return "\n".join(lines)
