"""Each training step's global ``(B, S)`` and its model FLOPs.

Owns: the count of steps trained per global shape (the summary's tokens/s
and MFU read it: ``sequence_lengths`` varies ``S`` per step) and the mean
model FLOPs of the steps since the last log (the per-step ``trainer/mfu``).

Must never: count a batch that was fetched but not stepped on (a prefetched
one), or take the config's fixed ``S`` for a step's real one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from headwater.model.scale import train_flops_per_step


class StepShapes:
    """Shapes and FLOPs of the steps a trainer ran."""

    def __init__(self, model_cfg: Any, devices_per_stream: int, devices: int) -> None:
        self.model_cfg = model_cfg
        self.devices_per_stream = devices_per_stream
        self.devices = devices
        #: Steps trained per global ``(B, S)``.
        self.counts: Counter[tuple[int, int]] = Counter()
        #: Mean model FLOPs of a step over the last logged window.
        self.flops_now = 0.0
        self._flops_of: dict[tuple[int, int], float] = {}
        self._window: list[float] = []

    def global_shape(self, local: tuple[int, int]) -> tuple[int, int]:
        """The global ``(B, S)`` of a step whose local batch (one stream's)
        is ``local``."""
        b, s = local
        return (b // self.devices_per_stream * self.devices, s)

    def flops(self, shape: tuple[int, int]) -> float:
        """Model FLOPs of a global step of ``shape`` (cached per shape)."""
        if shape not in self._flops_of:
            self._flops_of[shape] = train_flops_per_step(self.model_cfg, *shape)
        return self._flops_of[shape]

    def stepped(self, shape: tuple[int, int]) -> None:
        """A step of ``shape`` was trained."""
        self.counts[shape] += 1
        self._window.append(self.flops(shape))

    def flush(self) -> None:
        """Close the logged window: :attr:`flops_now` becomes its mean."""
        if self._window:
            self.flops_now = sum(self._window) / len(self._window)
            self._window = []
