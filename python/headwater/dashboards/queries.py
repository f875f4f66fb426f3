"""Reading a built dashboard: its panels, its queries, the metric names they
use, and each query rendered for a plain Prometheus HTTP API."""

from __future__ import annotations

import re
from typing import Any


def _walk(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in panels:
        out.append(p)
        out.extend(_walk(p.get("panels") or []))
    return out


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel (rows included, and the panels of collapsed rows), in order."""
    return _walk(dashboard.get("panels") or [])


def queries(dashboard: dict[str, Any]) -> list[dict[str, str]]:
    """Every Prometheus expression: ``{"panel": title, "refId": ..., "expr": ...}``."""
    return [
        {"panel": p.get("title", ""), "refId": t.get("refId", ""), "expr": t["expr"]}
        for p in panels(dashboard)
        for t in p.get("targets") or []
        if t.get("expr")
    ]


_VAR = re.compile(r"\$(?:\{(\w+)(?::[\w-]+)?\}|(\w+))")


def _quote(s: str) -> str:
    # The values land inside PromQL double-quoted strings.
    return s.replace("\\", "\\\\").replace('"', '\\"')


def render_expr(
    expr: str,
    rank_regex: str = ".*",
    split: str = "train",
    rate_interval: str = "15s",
    *,
    interval: str | None = None,
    range_: str = "1h",
) -> str:
    """``expr`` with the Grafana variables substituted, for a plain Prometheus API.

    ``$rank`` / ``${rank}`` (used as ``rank=~"$rank"``) becomes ``rank_regex``,
    ``$split`` becomes ``split`` (both escaped for a PromQL string literal),
    ``$__rate_interval`` becomes ``rate_interval``, ``$__interval`` becomes
    ``interval`` (default: ``rate_interval``) and ``$__range`` becomes ``range_``.
    Unknown variables are left in place.
    """
    values = {
        "rank": _quote(rank_regex),
        "split": _quote(split),
        "__rate_interval": rate_interval,
        "__interval": interval if interval is not None else rate_interval,
        "__range": range_,
    }

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return _VAR.sub(sub, expr)


_IDENT = re.compile(r"\bheadwater_[A-Za-z0-9_]*")
_SERIES_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def metric_names(expr: str) -> set[str]:
    """The exporter metrics ``expr`` reads (histogram series without
    ``_bucket`` / ``_sum`` / ``_count``; recording-rule names included)."""
    return {_SERIES_SUFFIX.sub("", m) for m in _IDENT.findall(expr)}
