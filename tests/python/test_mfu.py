"""MFU per step (``trainer/mfu``): the model FLOPs of a global step over its
time and the devices' peak where the peak is known; absent (not 0, not NaN)
where it is not, as on a CPU. The Prometheus side (the gauge is served once
set, not before) is in ``test_train.py``'s trainer-gauge test; a real CPU
run's rows have no ``trainer/mfu`` (``test_prefetch.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from headwater.train.throughput import PEAK_FLOPS, mfu_row


def test_mfu_row_is_the_flops_over_the_step_and_the_peak() -> None:
    kind = "NVIDIA H100 80GB HBM3"
    row = mfu_row(4.0e12, 0.01, 2, kind)
    assert row == {"trainer/mfu": pytest.approx(4.0e12 / 0.01 / (2 * PEAK_FLOPS[kind]))}
    assert 0 < row["trainer/mfu"] < 1


def test_mfu_row_is_absent_without_a_known_peak_or_a_step_time() -> None:
    assert mfu_row(4.0e12, 0.01, 1, "cpu") == {}
    assert mfu_row(4.0e12, 0.0, 1, "NVIDIA H100 80GB HBM3") == {}
