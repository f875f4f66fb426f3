"""The headwater sampler Grafana dashboard, as code.

The dashboard is built with ``grafana-foundation-sdk`` builders and committed as
``dashboards/headwater.json``; regenerate it from the repository root with::

    python -m headwater.dashboards                 # writes dashboards/headwater.json
    python -m headwater.dashboards --check         # exits 1 if the file is stale

Rooms: :mod:`.widgets` (panel and query builders), :mod:`.panels` (the rows),
:mod:`.queries` (listing and rendering the queries of a built dashboard) and
this module (:func:`build`, :func:`dumps`, :func:`main`).

:func:`queries` lists every expression of a built dashboard and
:func:`render_expr` substitutes the Grafana variables so that an expression can
be sent to a plain Prometheus HTTP API (the tests use both).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dash_m

from headwater.dashboards.contexts import _contexts
from headwater.dashboards.panels import (
    ROWS,
    _bfs,
    _invariants,
    _pool_health,
    _queue,
    _seq_len_panel,
    _stage_latency,
    _stalls,
    _task_mix,
    _throughput,
    _variables,
    _working_set,
)
from headwater.dashboards.queries import metric_names, panels, queries, render_expr

UID = "headwater-sampler"
TITLE = "headwater sampler"
DEFAULT_OUT = Path("dashboards") / "headwater.json"


def build() -> dict[str, Any]:
    """The dashboard as a plain JSON-able dict."""
    sections = (
        _pool_health(),
        _task_mix(),
        [*_bfs(), _seq_len_panel()],
        _contexts(),
        _queue(),
        _stage_latency(),
        [*_stalls(), *_working_set()],
        _invariants(),
        _throughput(),
    )
    d = (
        dash_b.Dashboard(TITLE)
        .uid(UID)
        .description("Per-rank and cluster health of the headwater sampler (Prometheus exporter).")
        .tags(["headwater", "sampler"])
        .editable()
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
    )
    for v in _variables():
        d = d.with_variable(v)
    next_id = 1
    for title, row_panels in zip(ROWS, sections, strict=True):
        row = dash_b.Row(title).id(next_id).collapsed(False)
        next_id += 1
        # An expanded row: its panels follow it at the top level.
        d = d.with_row(row)
        for p in row_panels:
            d = d.with_panel(p.id(next_id))
            next_id += 1
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def dumps(dashboard: dict[str, Any]) -> str:
    """The committed serialisation: sorted keys, indent 2, trailing newline."""
    return json.dumps(dashboard, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m headwater.dashboards",
        description="Write (or check) the headwater Grafana dashboard JSON.",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"dashboard JSON path (default: {DEFAULT_OUT}, relative to the working directory)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if the file differs from a fresh build",
    )
    args = ap.parse_args(argv)
    text = dumps(build())
    out: Path = args.out
    if args.check:
        current = out.read_text(encoding="utf-8") if out.exists() else None
        if current != text:
            what = "is missing" if current is None else "is stale"
            print(
                f"{out} {what}; regenerate with: python -m headwater.dashboards --out {out}",
                file=sys.stderr,
            )
            return 1
        print(f"{out} is up to date")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out} ({len(queries(json.loads(text)))} queries)")
    return 0


__all__ = ["ROWS", "build", "dumps", "main", "metric_names", "panels", "queries", "render_expr"]
