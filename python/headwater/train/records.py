"""What a training run writes besides W&B: rank 0's ``metrics.jsonl`` and
the optional per-rank ``drains-rank<r>.jsonl``, plus the progress line.

Owns: :class:`JsonlSink` (a telemetry sink: one JSON row per step of the
reduced scalars, and the trainer's own rows), :class:`DrainRecorder` (wraps a
sampler and records every packed drain the hook takes, to check the
reduction against) and :class:`Progress` (rank 0's progress line).

Must never: write histogram bucket counts (rows stay small), or drain the
sampler on its own (the recorder only sees the hook's drains).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from headwater.evaluation.evaluate import pass_progress


def scalars(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` without histogram bucket counts (the JSONL files' rows)."""
    return {k: v for k, v in metrics.items() if "/bucket_" not in k}


class JsonlSink:
    """A telemetry sink writing ``{"step": t, **reduced scalars}`` per line."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.file = path.open("a" if append else "w", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.write({"step": step, **scalars(metrics)})

    def write(self, row: Mapping[str, Any]) -> None:
        # Flushed per row: a killed run keeps every row it wrote (a resume
        # drops the ones after its checkpoint).
        self.file.write(json.dumps(row, allow_nan=True) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class DrainRecorder:
    """Forwards a sampler, writing every packed drain of the hook as a JSONL row."""

    def __init__(self, sampler: Any, path: Path) -> None:
        self.sampler = sampler
        self.keys = tuple(sampler.telemetry_keys())
        self.file = path.open("w", encoding="utf-8")
        self.step = 0

    def drain_step_metrics_packed(self, split: str = "train") -> Any:
        v = self.sampler.drain_step_metrics_packed(split)
        row = scalars(dict(zip(self.keys, v.tolist(), strict=True))) if len(v) else {}
        self.file.write(json.dumps({"step": self.step, **row}) + "\n")
        self.step += 1
        return v

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    def close(self) -> None:
        self.file.close()


class Progress:
    """Rank 0's progress: a self-rewriting line on a terminal, else a line
    every ``log_every`` steps. The loss shown is the one the caller passes:
    the mean of the last window of steps (no running mean, which would carry
    over a restart)."""

    def __init__(self, total: int, log_every: int, enabled: bool) -> None:
        self.total, self.log_every, self.enabled = total, log_every, enabled
        self.tty = enabled and sys.stdout.isatty()
        self.shown = False

    def update(
        self,
        step: int,
        loss: float,
        bps: float,
        wait_share: float,
        verdict: str = "ok",
        culprit: int = -1,
        useful_cells_per_s: float = 0.0,
        mean_of: int = 1,
        step_loss: float | None = None,
    ) -> None:
        """``loss``: the step's own (``mean_of`` 1) or the mean of the
        window of ``mean_of`` steps it ends, which the line says. The run's
        first line shows ``step_loss``, its first step's own loss (the one
        the summary starts from), when given."""
        if not self.enabled:
            return
        if not self.shown and step_loss is not None:
            loss, mean_of = step_loss, 1
        self.shown = True
        named = f" (rank {culprit})" if culprit >= 0 else ""
        of = f" (mean of {mean_of} steps)" if mean_of > 1 else ""
        line = (
            f"step {step + 1:>5}/{self.total}  loss {loss:8.4f}{of}  "
            f"{bps:7.2f} batches/s  {useful_cells_per_s:9.0f} useful cells/s  data wait {100 * wait_share:5.2f}%  {verdict}{named}"
        )
        if self.tty:
            print("\r" + line, end="", flush=True)
            if step + 1 == self.total:
                print()
        elif (step + 1) % self.log_every == 0 or step == 0 or step + 1 == self.total:
            print(line, flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            print(("\n" if self.tty else "") + text, flush=True)

    def pass_progress(self, what: str) -> Callable[[int, int], None] | None:
        """An evaluation pass's progress callback
        (:func:`headwater.evaluation.evaluate.pass_progress`) on rank 0."""
        return pass_progress(what, self.tty) if self.enabled else None
