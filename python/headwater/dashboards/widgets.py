"""The panel and query builders every dashboard row is made of.

Owns: the label matcher (:data:`SEL`) and rate range (:data:`RI`) every query
carries, :class:`Q` (one Prometheus target), the PromQL of a metric-table
row (:func:`across`, :func:`increase`, :func:`quantile`, :func:`prom`) and
the three panel kinds (time series, heatmap, stat).

A panel's description ends with the healthy band (``headwater diag``'s) of
each metric its queries read, from the row (:func:`with_bands`).

A query names its metric by its row of the metric table
(``_native.metric_table()``); the Prometheus name, and how the row is
reduced across ranks (``min`` / ``max`` of a gauge by its ``MIN`` / ``MAX``
reduction, ``sum`` of the rate of a summed counter or histogram sum,
``sum by (le)`` of a histogram's buckets), come from that row.

Must never: spell a Prometheus name or restate a row's reduction by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prom_m

from headwater import _native
from headwater.rows import MetricRow, band_text

#: The label matcher every query carries (Grafana substitutes the variables).
SEL = '{rank=~"$rank", split="$split"}'
#: The range of every ``rate`` / ``increase`` in a time series.
RI = "[$__rate_interval]"

DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")


#: The metric table (Rust), by key.
METRICS: dict[str, MetricRow] = {r["key"]: r for r in _native.metric_table()}
#: The PromQL aggregation across ranks of each reduction.
AGGREGATION = {"MIN": "min", "MAX": "max", "SUM": "sum"}


def prom(key: str) -> str:
    """The Prometheus name of metric-table row ``key``."""
    return METRICS[key]["prometheus"]


def _row(key: str, *reductions: str) -> MetricRow:
    row = METRICS[key]
    if row["reduction"] not in reductions:
        raise ValueError(f"{key!r} is a {row['reduction']} row, not {' or '.join(reductions)}")
    return row


def _rate(metric: str) -> str:
    return f"rate({metric}{SEL}{RI})"


def across(key: str, by: str | None = None) -> str:
    """Row ``key`` reduced across ranks as its reduction says (``by``: one
    series per value of that label): ``min`` / ``max`` of a ``MIN`` /
    ``MAX`` gauge, ``sum`` of the rate of a ``SUM`` counter (of the
    ``_sum`` series of a ``SUM`` histogram)."""
    row = _row(key, *AGGREGATION)
    name = row["prometheus"]
    if row["reduction"] == "SUM":
        inner = _rate(f"{name}_sum" if row["prometheus_type"] == "histogram" else name)
    else:
        inner = f"{name}{SEL}"
    agg = AGGREGATION[row["reduction"]]
    return f"{agg} by ({by}) ({inner})" if by else f"{agg}({inner})"


def worst(per_rank: str) -> str:
    """The largest series of the per-rank expression ``per_rank`` (the worst rank)."""
    return f"max({per_rank})"


def increase(key: str, by: str | None = None) -> str:
    """The ``SUM`` counter ``key`` summed over ranks and the dashboard's time range."""
    name = _row(key, "SUM")["prometheus"]
    inner = f"increase({name}{SEL}[$__range])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def quantile(q: float, key: str) -> str:
    """Quantile ``q`` of the histogram row ``key`` from the buckets summed over ranks."""
    name = _row(key, "HISTOGRAM")["prometheus"]
    return f"histogram_quantile({q}, sum by (le) ({_rate(name + '_bucket')}))"


def _heat(key: str) -> str:
    name = _row(key, "HISTOGRAM")["prometheus"]
    return f"sum by (le) (increase({name}_bucket{SEL}{RI}))"


@dataclass(frozen=True)
class Q:
    """One Prometheus target: expression, legend and options."""

    expr: str
    legend: str
    heatmap: bool = False
    instant: bool = False


def _target(q: Q, ref_id: str) -> prom_b.Dataquery:
    t = (
        prom_b.Dataquery()
        .expr(q.expr)
        .legend_format(q.legend)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .editor_mode(prom_m.QueryEditorMode.CODE)
    )
    if q.heatmap:
        t = t.format(prom_m.PromQueryFormat.HEATMAP)
    return t.instant() if q.instant else t.range()


def _ref_id(i: int) -> str:
    return chr(ord("A") + i)


# --------------------------------------------------------------------------- panels


def with_bands(description: str, exprs: Sequence[str]) -> str:
    """``description`` followed by the healthy band of each metric-table row
    with one whose Prometheus name a query of ``exprs`` reads."""
    found = []
    for row in METRICS.values():
        name, band = row["prometheus"], row["healthy"]
        if band and any(re.search(rf"\b{re.escape(name)}(?![a-z_])", e) for e in exprs):
            found.append(f"`{row['key']}`: {band_text(band)}")
    if not found:
        return description
    return f"{description} headwater diag judges " + "; ".join(found) + "."


def _timeseries(
    title: str,
    description: str,
    targets: Sequence[Q],
    *,
    unit: str = "short",
    span: int = 8,
    stacking: common_m.StackingMode | None = None,
    min_val: float | None = 0,
    max_val: float | None = None,
) -> ts_b.Panel:
    p = (
        ts_b.Panel()
        .title(title)
        .description(with_bands(description, [q.expr for q in targets]))
        .datasource(DATASOURCE)
        .unit(unit)
        .span(span)
        .height(8)
        .fill_opacity(10)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common_m.LegendDisplayMode.LIST)
            .placement(common_m.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common_m.TooltipDisplayMode.MULTI)
            .sort(common_m.SortOrder.DESCENDING)
        )
    )
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if stacking is not None:
        p = p.fill_opacity(60).stacking(common_b.StackingConfig().mode(stacking).group("A"))
    for i, q in enumerate(targets):
        p = p.with_target(_target(q, _ref_id(i)))
    return p


def _heatmap(title: str, description: str, key: str, *, unit: str) -> heatmap_b.Panel:
    return (
        heatmap_b.Panel()
        .title(title)
        .description(with_bands(description, [_heat(key)]))
        .datasource(DATASOURCE)
        .span(8)
        .height(8)
        .calculate(False)
        .color(
            heatmap_b.HeatmapColorOptions()
            .mode(heatmap_m.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .y_axis(heatmap_b.YAxisConfig().unit(unit))
        .cell_values(heatmap_b.CellValues().unit("short"))
        .show_tooltip()
        .show_legend()
        .with_target(_target(Q(_heat(key), "{{le}}", heatmap=True), "A"))
    )


def _stat(title: str, description: str, q: Q) -> stat_b.Panel:
    return (
        stat_b.Panel()
        .title(title)
        .description(with_bands(description, [q.expr]))
        .datasource(DATASOURCE)
        .span(6)
        .height(8)
        .unit("short")
        .decimals(0)
        .thresholds(
            dash_b.ThresholdsConfig()
            .mode(dash_m.ThresholdsMode.ABSOLUTE)
            .steps([dash_m.Threshold(value=None, color="green"), dash_m.Threshold(1, "red")])
        )
        .color_mode(common_m.BigValueColorMode.BACKGROUND)
        .graph_mode(common_m.BigValueGraphMode.NONE)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(_target(q, "A"))
    )


PanelBuilder = ts_b.Panel | heatmap_b.Panel | stat_b.Panel
