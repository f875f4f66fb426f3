"""The end of a training run as printed: :func:`headwater.train.summary.format_summary`
(a phase that did not run says so, never NaN; training and evaluation time
apart) and the progress line's loss (the window's, no running mean)."""

from __future__ import annotations

from typing import Any

import pytest


def _summary_of(log: Any, steps_run: int, **extra: Any) -> dict[str, Any]:
    from headwater.train.summary import summarise
    from headwater.train.verdict import VerdictTracker

    layout = {
        "processes": 1, "local_devices": 1, "platform": "cpu", "devices": 1,
        "global_batch": 4, "per_device_batch": 4, "per_process_batch": 4,
    }
    vt = VerdictTracker(1, 1, 8)
    for i in range(steps_run):
        vt.observe({}, 0.01 + 0.001 * i, 0.0)
        vt.settle(0.011)
    return summarise(
        log, warmup_steps=1, world=1, wall=10.0, rank=0, batch_layout=layout,
        metrics_endpoints=[], wandb_dir=None, **vt.summary(), **extra,
    )


def test_a_phase_with_no_steps_says_so(recwarn: pytest.WarningsRecorder) -> None:
    """A resume with only the final evaluation left, and a stop before the
    final validation: no `nan`, no NumPy warning, training and evaluation
    time apart."""
    from headwater.train.summary import RunLog, format_summary

    s = _summary_of(
        RunLog(), 0, final_val_loss=float("nan"), eval_seconds=9.5, start_step=40,
        interrupted=None,
    )
    text = format_summary(s, profile=True)
    assert "nan" not in text.lower(), text
    assert "done: no training steps in this attempt (resumed at step 40, all trained)" in text
    assert "0.5 s training + 9.5 s evaluation" in text
    assert "loss: no steps; no final validation" in text and "headspace: not measured" in text
    assert not [w for w in recwarn if "empty slice" in str(w.message)]

    log = RunLog(losses=[2.0, 1.5, 1.0])
    for _ in range(3):
        log.record_phases((0.001, 0.001, 0.01, 0.001, 0.001))
    s = _summary_of(
        log, 3, final_val_loss=float("nan"), eval_seconds=0.0, start_step=0, interrupted="SIGTERM"
    )
    text = format_summary(s)
    assert "nan" not in text.lower(), text
    assert "done: 3 steps in 10.0 s training + 0.0 s evaluation" in text
    assert "final validation not run (stopped by SIGTERM)" in text
    s["final_val_loss"] = 1.25
    assert "val loss 1.2500" in format_summary(s)


def test_the_progress_loss_is_the_windows(capsys: pytest.CaptureFixture[str]) -> None:
    """The progress line prints the loss it is given (the window's mean),
    with no running mean carried between lines (or over a restart)."""
    from headwater.train.records import Progress

    p = Progress(total=4, log_every=2, enabled=True)
    p.update(1, 5.0, 1.0, 0.0)
    p.update(3, 1.0, 1.0, 0.0)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("loss")[1].split()[0] for ln in lines] == ["5.0000", "1.0000"], lines
    p.update(3, 2.5, 1.0, 0.0, mean_of=2)
    assert "loss   2.5000 (mean of 2 steps)" in capsys.readouterr().out


def test_the_summary_starts_from_the_first_progress_lines_loss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The first progress line shows step 1's own loss (not the mean of the
    first log window, which the step-25 line shows); the summary names that
    same loss first, then the means of the first and last steps, saying
    how many."""
    from headwater.train.records import Progress
    from headwater.train.summary import RunLog, format_summary

    losses = [5.0] + [1.0] * 59
    p = Progress(total=60, log_every=25, enabled=True)
    window = sum(losses[:25]) / 25
    for step in range(25):  # the first window's rows, as a flush writes them
        p.update(step, window, 1.0, 0.0, mean_of=25, step_loss=losses[step])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "(mean of 25 steps)" in lines[1], lines
    shown = lines[0].split("loss")[1].split()[0]
    assert shown == "5.0000" and "mean of" not in lines[0], lines

    log = RunLog(losses=losses)
    for _ in losses:
        log.record_phases((0.001, 0.001, 0.01, 0.001, 0.001))
    s = _summary_of(
        log, len(losses), final_val_loss=0.5, eval_seconds=0.0, start_step=0, interrupted=None
    )
    text = format_summary(s)
    assert f"loss {shown} at step 1; mean of the first 10 steps 1.4000 -> last 10 1.0000" in text
    assert "val loss 0.5000" in text
    # Too few steps for a mean (one per end): the two steps' own losses.
    s = _summary_of(
        RunLog(losses=[2.0, 1.5]), 2, final_val_loss=0.5, eval_seconds=0.0, start_step=40,
        interrupted=None,
    )
    assert "loss 2.0000 at step 41 -> 1.5000 at step 42; val loss 0.5000" in format_summary(s)
