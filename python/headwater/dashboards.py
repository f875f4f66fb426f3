"""The headwater sampler Grafana dashboard, as code.

The dashboard is built with ``grafana-foundation-sdk`` builders and committed as
``dashboards/headwater.json``; regenerate it from the repository root with::

    python -m headwater.dashboards                 # writes dashboards/headwater.json
    python -m headwater.dashboards --check         # exits 1 if the file is stale

Every query reads the per-rank series of the sampler's Prometheus exporter
(``Sampler(..., prometheus_port=...)``), filtered by ``rank=~"$rank"`` and
``split="$split"``, and reduces them across ranks the way the metric demands:
``min`` for ``*_min`` gauges, ``max`` for ``*_max`` gauges and the TV distance,
``sum`` for counter rates, and ``sum by (le)`` of the buckets before
``histogram_quantile`` (never an average of per-rank quantiles).

:func:`queries` lists every expression of a built dashboard and
:func:`render_expr` substitutes the Grafana variables so that an expression can
be sent to a plain Prometheus HTTP API (the tests use both).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prom_m

UID = "headwater-sampler"
TITLE = "headwater sampler"
DEFAULT_OUT = Path("dashboards") / "headwater.json"

#: The label matcher every query carries (Grafana substitutes the variables).
SEL = '{rank=~"$rank", split="$split"}'
#: The range of every ``rate`` / ``increase`` in a time series.
RI = "[$__rate_interval]"

DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")

#: Every metric the exporter serves (histograms without ``_bucket/_sum/_count``).
METRICS: tuple[str, ...] = (
    # counters
    "headwater_batches_delivered_total",
    "headwater_task_seeds_drawn_total",
    "headwater_pool_exhaust_events_total",
    "headwater_truncation_cells_dropped_total",
    "headwater_bfs_children_capped_total",
    "headwater_bfs_temporal_filtered_total",
    "headwater_invariant_duplicate_seeds_total",
    "headwater_invariant_temporal_leaks_total",
    # gauges
    "headwater_pool_remaining_min_seeds",
    "headwater_pool_remaining_max_seeds",
    "headwater_pool_remaining_fraction_min_ratio",
    "headwater_pool_remaining_fraction_max_ratio",
    "headwater_pool_steps_since_pick_max_batches",
    "headwater_pool_steps_to_exhaust_min_batches",
    "headwater_mix_tv_distance_ratio",
    "headwater_queue_depth_batches",
    # histograms
    "headwater_bfs_depth_hops",
    "headwater_bfs_sequence_rows",
    "headwater_padding_fraction_ratio",
    "headwater_queue_wait_seconds",
    "headwater_stage_bfs_seconds",
    "headwater_stage_assemble_seconds",
    "headwater_stage_collate_seconds",
    "headwater_stage_total_seconds",
)

#: Row titles, top to bottom.
ROWS: tuple[str, ...] = (
    "Pool health",
    "Task mix",
    "BFS",
    "Queue",
    "Stage latency",
    "Invariants",
    "Throughput",
)

STAGES: tuple[str, ...] = ("bfs", "assemble", "collate", "total")


# --------------------------------------------------------------------------- queries


def _rate(metric: str) -> str:
    return f"rate({metric}{SEL}{RI})"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) ({_rate(histogram + '_bucket')}))"


def _heat(histogram: str) -> str:
    return f"sum by (le) (increase({histogram}_bucket{SEL}{RI}))"


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
        .description(description)
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


def _heatmap(title: str, description: str, histogram: str, *, unit: str) -> heatmap_b.Panel:
    return (
        heatmap_b.Panel()
        .title(title)
        .description(description)
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
        .with_target(_target(Q(_heat(histogram), "{{le}}", heatmap=True), "A"))
    )


def _stat(title: str, description: str, q: Q) -> stat_b.Panel:
    return (
        stat_b.Panel()
        .title(title)
        .description(description)
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


def _pool_health() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Pool remaining seeds",
            "Seeds left before reshuffle in the least / most full active pool (cluster min of "
            "the per-rank min, cluster max of the per-rank max; per-rank series too). Healthy: "
            "a sawtooth that refills at each reshuffle. Pathological: the cluster min pinned "
            "near 0 (a pool keeps running out) or one rank far below the others.",
            [
                Q(f"min(headwater_pool_remaining_min_seeds{SEL})", "cluster min"),
                Q(f"max(headwater_pool_remaining_max_seeds{SEL})", "cluster max"),
                Q(f"min by (rank) (headwater_pool_remaining_min_seeds{SEL})", "rank {{rank}} min"),
                Q(f"max by (rank) (headwater_pool_remaining_max_seeds{SEL})", "rank {{rank}} max"),
            ],
        ),
        _timeseries(
            "Pool remaining fraction",
            "Fraction of its seeds the emptiest (cluster min of *_min_ratio) and fullest "
            "(cluster max of *_max_ratio) task pool still holds. Healthy: min and max move "
            "together (pools drain at matching speeds). Pathological: min near 0 while max stays "
            "high; one task's pool drains much faster than the mix intends.",
            [
                Q(f"min(headwater_pool_remaining_fraction_min_ratio{SEL})", "cluster min"),
                Q(f"max(headwater_pool_remaining_fraction_max_ratio{SEL})", "cluster max"),
            ],
            unit="percentunit",
            max_val=1,
        ),
        _timeseries(
            "Pool exhaust events/s",
            "Pools that ran out and reshuffled, per second, cluster sum and per rank. Healthy: "
            "rare bumps at epoch boundaries, even across ranks. Pathological: a sustained high "
            "rate (tiny pools, seeds repeat often) or one rank exhausting far more than the rest.",
            [
                Q(f"sum({_rate('headwater_pool_exhaust_events_total')})", "cluster"),
                Q(
                    f"sum by (rank) ({_rate('headwater_pool_exhaust_events_total')})",
                    "rank {{rank}}",
                ),
            ],
            unit="ops",
        ),
        _timeseries(
            "Steps since pick (max)",
            "Batches since the least recently picked weighted task was picked (cluster max). "
            "Healthy: bounded and flat; every task gets picked. Pathological: grows without "
            "bound, a task is starved.",
            [Q(f"max(headwater_pool_steps_since_pick_max_batches{SEL})", "cluster max")],
            span=12,
        ),
        _timeseries(
            "Steps to exhaust (min)",
            "Forecast batches until the first active pool runs out (cluster min). Healthy: "
            "large, or a steady countdown that resets on reshuffle. Pathological: stuck near 0; "
            "pools run out every few batches.",
            [Q(f"min(headwater_pool_steps_to_exhaust_min_batches{SEL})", "cluster min")],
            span=12,
        ),
    ]


def _task_mix() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Task mix (seeds drawn/s by task)",
            "Seeds drawn per second by task, summed over ranks and stacked as a percentage of "
            "the total. Healthy: bands whose widths match the configured mix weights. "
            "Pathological: a band that shrinks to 0 (task starved) or drifts from its weight.",
            [
                Q(
                    f"sum by (task) ({_rate('headwater_task_seeds_drawn_total')})",
                    "{{task}}",
                )
            ],
            unit="cps",
            span=16,
            stacking=common_m.StackingMode.PERCENT,
        ),
        _timeseries(
            "Task mix TV distance",
            "Total-variation distance of the recent task mix from the configured weights "
            "(cluster max, i.e. the worst rank; per rank too). Healthy: small and steady. "
            "Pathological: high or rising; the sampler is not delivering the requested mix.",
            [
                Q(f"max(headwater_mix_tv_distance_ratio{SEL})", "cluster max"),
                Q(f"max by (rank) (headwater_mix_tv_distance_ratio{SEL})", "rank {{rank}}"),
            ],
            unit="percentunit",
        ),
    ]


def _bfs() -> list[PanelBuilder]:
    return [
        _heatmap(
            "BFS depth (hops)",
            "BFS hops reached per sequence (bucket increases summed over ranks). Healthy: a "
            "stable distribution with most sequences several hops deep. Pathological: mass at "
            "0 hops (seeds without neighbours) or a sudden shift.",
            "headwater_bfs_depth_hops",
            unit="short",
        ),
        _heatmap(
            "BFS sequence rows",
            "Rows per sequence (bucket increases summed over ranks). Healthy: a tight band "
            "near what the sequence budget holds. Pathological: a long tail of tiny sequences "
            "(isolated seeds) or a sudden shift.",
            "headwater_bfs_sequence_rows",
            unit="short",
        ),
        _heatmap(
            "Padding fraction",
            "Padded share of each sequence (bucket increases summed over ranks). Healthy: mass "
            "near 0. Pathological: mass near 1; compute wasted on padding.",
            "headwater_padding_fraction_ratio",
            unit="percentunit",
        ),
        _timeseries(
            "Padding fraction p50/p95",
            "Median and 95th percentile of the padding fraction from the cluster-merged "
            "buckets. Healthy: p95 low (a few %). Pathological: p50 high, or p95 near 1.",
            [
                Q(_quantile(0.5, "headwater_padding_fraction_ratio"), "p50"),
                Q(_quantile(0.95, "headwater_padding_fraction_ratio"), "p95"),
            ],
            unit="percentunit",
            max_val=1,
            span=6,
        ),
        _timeseries(
            "Truncation cells dropped/s",
            "Cells of reached rows cut by the sequence budget, per second, cluster sum. "
            "Healthy: 0 or a small steady rate. Pathological: a large or rising rate; the "
            "sequence length is too short for the neighbourhoods reached.",
            [Q(f"sum({_rate('headwater_truncation_cells_dropped_total')})", "cluster")],
            unit="cps",
            span=6,
        ),
        _timeseries(
            "BFS children capped/s",
            "Visible children not sampled because of bfs_child_width, per second, cluster sum. "
            "Healthy: a steady rate set by the cap. Pathological: a jump; hub rows dominate "
            "and neighbourhoods are sampled thinly.",
            [Q(f"sum({_rate('headwater_bfs_children_capped_total')})", "cluster")],
            unit="cps",
            span=6,
        ),
        _timeseries(
            "BFS temporal filtered/s",
            "Children hidden by the observation-time filter, per second, cluster sum. Healthy: "
            "steady, roughly proportional to batches/s. Pathological: 0 on a temporal database "
            "(the filter is not applied) or a sudden swing.",
            [Q(f"sum({_rate('headwater_bfs_temporal_filtered_total')})", "cluster")],
            unit="cps",
            span=6,
        ),
    ]


_WAIT_SHARE = f"sum by (rank) ({_rate('headwater_queue_wait_seconds_sum')})"


def _queue() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Queue depth per rank (min)",
            "Fewest batches waiting in the prefetch channel at a consumer call, per rank, plus "
            "the cluster min. Healthy: above 0; the sampler runs ahead of training. "
            "Pathological: 0 on a rank; that rank's training step waits for data.",
            [
                Q(f"min by (rank) (headwater_queue_depth_batches{SEL})", "rank {{rank}}"),
                Q(f"min(headwater_queue_depth_batches{SEL})", "cluster min"),
            ],
        ),
        _timeseries(
            "Data-wait share per rank",
            "Seconds the consumer blocked in next_*_batch per second of wall time, per rank "
            "(rate of headwater_queue_wait_seconds_sum); the share of training time spent "
            "waiting for data. Healthy: ~0%. Pathological: a few % or more, input-bound.",
            [Q(_WAIT_SHARE, "rank {{rank}}")],
            unit="percentunit",
        ),
        _timeseries(
            "Data-wait share (worst rank)",
            "The largest per-rank data-wait share (cluster max): in synchronous data-parallel "
            "training the slowest rank sets the pace. Healthy: ~0%. Pathological: above a few "
            "%; the whole job is input-bound.",
            [Q(f"max({_WAIT_SHARE})", "worst rank")],
            unit="percentunit",
        ),
    ]


def _stage_latency() -> list[PanelBuilder]:
    return [
        _timeseries(
            f"Stage latency: {s}",
            f"p50 and p95 of the {s} stage time per batch, from buckets summed over ranks. "
            "Healthy: flat, with p95 close to p50. Pathological: p95 far above p50 (stragglers) "
            "or a rising trend.",
            [
                Q(_quantile(0.5, f"headwater_stage_{s}_seconds"), "p50"),
                Q(_quantile(0.95, f"headwater_stage_{s}_seconds"), "p95"),
            ],
            unit="s",
            span=6,
        )
        for s in STAGES
    ]


def _invariants() -> list[PanelBuilder]:
    dup = "headwater_invariant_duplicate_seeds_total"
    leak = "headwater_invariant_temporal_leaks_total"
    return [
        _stat(
            "Duplicate seeds (time range)",
            "Seeds drawn twice in one epoch on one rank, over the dashboard's time range "
            "(cluster sum). Healthy: 0 (green). Pathological: anything above 0 (red) is a bug.",
            Q(f"sum(increase({dup}{SEL}[$__range]))", "duplicates", instant=True),
        ),
        _stat(
            "Temporal leaks (time range)",
            "Rows with a time after the seed's observation time, over the dashboard's time "
            "range (cluster sum). Healthy: 0 (green). Pathological: above 0 (red); future "
            "information leaks into training.",
            Q(f"sum(increase({leak}{SEL}[$__range]))", "leaks", instant=True),
        ),
        _timeseries(
            "Invariant violations/s per rank",
            "Rates of duplicate seeds and temporal leaks per rank. Healthy: flat at 0. "
            "Pathological: any non-zero series, which names the offending rank.",
            [
                Q(f"sum by (rank) ({_rate(dup)})", "duplicate seeds rank {{rank}}"),
                Q(f"sum by (rank) ({_rate(leak)})", "temporal leaks rank {{rank}}"),
            ],
            unit="cps",
            span=12,
        ),
    ]


def _throughput() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Batches delivered/s",
            "Batches handed to the trainer per second, cluster sum and per rank. Healthy: flat, "
            "ranks equal. Pathological: dips (stalls), or one rank below the rest (it holds "
            "back the synchronous step).",
            [
                Q(f"sum({_rate('headwater_batches_delivered_total')})", "cluster"),
                Q(f"sum by (rank) ({_rate('headwater_batches_delivered_total')})", "rank {{rank}}"),
            ],
            unit="ops",
            span=24,
        ),
    ]


# --------------------------------------------------------------------------- dashboard


def _variables() -> list[dash_b.QueryVariable | dash_b.DatasourceVariable | dash_b.CustomVariable]:
    train = dash_m.VariableOption(selected=True, text="train", value="train")
    val = dash_m.VariableOption(selected=False, text="val", value="val")
    return [
        dash_b.DatasourceVariable("datasource")
        .label("Data source")
        .id("datasource")
        .type("prometheus"),
        dash_b.QueryVariable("rank")
        .id("rank")
        .label("Rank")
        .datasource(DATASOURCE)
        .query("label_values(headwater_batches_delivered_total, rank)")
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.NUMERICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dash_m.VariableOption(selected=True, text=["All"], value=["$__all"])),
        dash_b.CustomVariable("split")
        .id("split")
        .label("Split")
        .values("train,val")
        .current(train)
        .options([train, val]),
    ]


def build() -> dict[str, Any]:
    """The dashboard as a plain JSON-able dict."""
    sections = (
        _pool_health(),
        _task_mix(),
        _bfs(),
        _queue(),
        _stage_latency(),
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
    for title, panels in zip(ROWS, sections, strict=True):
        row = dash_b.Row(title).id(next_id).collapsed(False)
        next_id += 1
        # An expanded row: its panels follow it at the top level.
        d = d.with_row(row)
        for p in panels:
            d = d.with_panel(p.id(next_id))
            next_id += 1
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def dumps(dashboard: dict[str, Any]) -> str:
    """The committed serialisation: sorted keys, indent 2, trailing newline."""
    return json.dumps(dashboard, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


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


if __name__ == "__main__":
    sys.exit(main())
