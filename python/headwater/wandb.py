"""``headwater.wandb``: the W&B sink for the step telemetry.

The implementation lives in :mod:`headwater.wandb_sink`; imports there are
absolute, so ``import wandb`` inside the package still means the W&B client.
"""

from __future__ import annotations

from headwater.wandb_sink import STEP_METRIC, WandbSink, summary_for

__all__ = ["STEP_METRIC", "WandbSink", "summary_for"]
