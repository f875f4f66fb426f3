"""``headwater diag``: proving that every sampler-health signal works.

Rooms: :mod:`.signals` (each signal's statistic, trace, unit and healthy
band), :mod:`.spec` (a config's ``[diag]`` section), :mod:`.verdict`
(judging a run, the table and the pathology × signal matrix), :mod:`.plot`
(the PNG panels) and :mod:`.run` (running configs, the command line).
"""

from __future__ import annotations

from headwater.diag.run import main, run_diag
from headwater.diag.signals import SIGNALS, Signal
from headwater.diag.spec import DiagSpec, Expect, load_spec
from headwater.diag.verdict import (
    DiagResult,
    Verdict,
    context,
    evaluate,
    format_matrix,
    format_table,
    read_rows,
)

__all__ = [
    "SIGNALS",
    "DiagResult",
    "DiagSpec",
    "Expect",
    "Signal",
    "Verdict",
    "context",
    "evaluate",
    "format_matrix",
    "format_table",
    "load_spec",
    "main",
    "read_rows",
    "run_diag",
]
