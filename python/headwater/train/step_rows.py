"""The trainer's row of each step: its metrics, learning rate, rates, data
wait share, input verdict and MFU, written to W&B, ``metrics.jsonl``, the
rank's Prometheus gauges (the same verdict on every rank's exporter) and
the progress line. Rows are written when a window of steps is flushed from
the device (:meth:`headwater.train.loop.Trainer._flush`): a window's rows
share its mean step time, wait share and useful cells per batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headwater.train.throughput import mfu_row
from headwater.train.verdict import VERDICTS


@dataclass(frozen=True)
class Window:
    """The means of one flushed window of steps."""

    #: Seconds per global step.
    step_s: float
    #: Share of the window's time spent waiting for batches.
    wait_share: float
    #: This rank's mean useful (non-padding) cells per batch.
    useful_per_batch: float
    #: The window's mean loss, and how many steps it holds.
    mean_loss: float
    steps: int


def write_row(t: Any, step: int, metrics: dict[str, float], w: Window) -> None:
    """Write step ``step``'s row of trainer ``t`` (a ``Trainer``)."""
    bps = t.world / w.step_s if w.step_s > 0 else 0.0
    # Useful (non-padding) cells the model trained on per second, all
    # ranks (this rank's mean useful cells per batch over the window).
    ucps = bps * w.useful_per_batch
    verdict, culprit, reason = t.verdict.live()
    mfu = mfu_row(t.step_shapes.flops_now, w.step_s, *t._devices)  # one global step
    row = {
        **{f"trainer/{k}": v for k, v in metrics.items()},
        "trainer/lr": float(t.lr(step)),
        "trainer/step_seconds": w.step_s,
        "trainer/batches_per_second": bps,
        "trainer/useful_cells_per_second": ucps,
        "trainer/data_wait_share": w.wait_share,
        "trainer/step": step,
        "trainer/verdict": float(VERDICTS.index(verdict)),
        # The named rank, only when the verdict names one.
        **({"trainer/verdict_rank": float(culprit)} if culprit >= 0 else {}),
        **mfu,  # absent where the device's peak is unknown (a CPU)
    }
    t.sampler.export_trainer(
        {
            "trainer/verdict": row["trainer/verdict"],
            "trainer/verdict_rank": float(culprit),
            "trainer/data_wait_share": w.wait_share,
            "trainer/headspace_ratio": t.verdict.headspace_now(),
            **mfu,
        }
    )
    if t.wb is not None:
        t.wb.log({**row, "trainer/verdict_reason": f"{verdict}: {reason}"})
    if t.jsonl is not None:
        t.jsonl.write({"step": step, **row})
    t.progress.update(
        step, w.mean_loss, bps, w.wait_share, verdict, culprit, ucps, w.steps, metrics["loss"]
    )
