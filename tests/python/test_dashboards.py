"""The Grafana dashboard built as code (``headwater.dashboards``).

Fast and offline: no Grafana, no Prometheus. The committed JSON must equal a
fresh build, every query must render to plain PromQL, use only metrics the
metric table (``headwater._native.metric_table()``) lists and reduce them
across ranks the right way.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grafana_foundation_sdk")

from headwater import _native, dashboards

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "dashboards" / "headwater.json"



def _exported(kind: str) -> set[str]:
    """The Prometheus names of one kind in the one metric table (Rust)."""
    return {
        m["prometheus"]
        for m in _native.metric_table()
        if m.get("prometheus") and m["prometheus_type"] == kind
    }


# Every name the exporter serves, read from the one metric table
# (histograms without ``_bucket`` / ``_sum`` / ``_count``).
COUNTERS = _exported("counter")
GAUGES = _exported("gauge")
HISTOGRAMS = _exported("histogram")
KNOWN = COUNTERS | GAUGES | HISTOGRAMS
REDUCTION = {r["prometheus"]: r["reduction"] for r in _native.metric_table()}
REQUIRED_ROWS = [
    "Pool health",
    "Task mix",
    "BFS",
    "In-context contexts",
    "Queue",
    "Stage latency",
    "Stalls and attribution",
    "Invariants",
    "Throughput",
]

_IDENT = re.compile(r"\bheadwater_[A-Za-z0-9_]*")


@pytest.fixture(scope="module")
def dash() -> dict[str, Any]:
    return dashboards.build()


@pytest.fixture(scope="module")
def exprs(dash: dict[str, Any]) -> list[dict[str, str]]:
    qs = dashboards.queries(dash)
    assert qs, "the dashboard has no Prometheus queries"
    return qs


def _metrics(expr: str) -> set[str]:
    return dashboards.metric_names(expr)


def _rendered(exprs: list[dict[str, str]]) -> list[str]:
    return [dashboards.render_expr(q["expr"]) for q in exprs]


# --------------------------------------------------------------------------- (a)


def test_committed_json_is_fresh(dash: dict[str, Any]) -> None:
    assert COMMITTED.exists(), "run: python -m headwater.dashboards"
    assert dashboards.dumps(dash) == COMMITTED.read_text(encoding="utf-8"), (
        "dashboards/headwater.json is stale; run: python -m headwater.dashboards"
    )


def test_build_is_deterministic(dash: dict[str, Any]) -> None:
    assert dashboards.dumps(dashboards.build()) == dashboards.dumps(dash)


def test_main_writes_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d" / "headwater.json"
    assert dashboards.main(["--out", str(out), "--check"]) == 1  # missing
    assert dashboards.main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == COMMITTED.read_text(encoding="utf-8")
    assert dashboards.main(["--out", str(out), "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("headwater sampler", "x"))
    assert dashboards.main(["--out", str(out), "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert dashboards.main(["--out", str(COMMITTED), "--check"]) == 0


# --------------------------------------------------------------------------- (b)


def test_every_query_renders_without_variables(exprs: list[dict[str, str]]) -> None:
    for q, r in zip(exprs, _rendered(exprs), strict=True):
        assert "$" not in r, f"{q['panel']}/{q['refId']}: unresolved variable in {r}"
        assert r.count("(") == r.count(")"), f"{q['panel']}/{q['refId']}: unbalanced {r}"
        assert r.count("{") == r.count("}"), f"{q['panel']}/{q['refId']}: unbalanced {r}"


def test_every_query_filters_rank_and_split(exprs: list[dict[str, str]]) -> None:
    for q in exprs:
        n = len(_IDENT.findall(q["expr"]))
        assert q["expr"].count('{rank=~"$rank", split="$split"}') == n, q


def test_render_expr_substitutions() -> None:
    r = dashboards.render_expr
    assert r('x{rank=~"$rank"}') == 'x{rank=~".*"}'
    assert r('x{rank=~"${rank}", split="${split}"}', "0|1", "val") == 'x{rank=~"0|1", split="val"}'
    assert r('x{rank=~"${rank:regex}"}', "3") == 'x{rank=~"3"}'
    assert r("rate(x[$__rate_interval])", rate_interval="1m") == "rate(x[1m])"
    assert r("rate(x[$__interval])", rate_interval="30s") == "rate(x[30s])"
    assert r("rate(x[$__interval])", interval="5s") == "rate(x[5s])"
    assert r("increase(x[$__range])", range_="6h") == "increase(x[6h])"
    # Only whole names are replaced; unknown ones stay visible.
    assert r("$__range_s $__interval_ms $other") == "$__range_s $__interval_ms $other"
    # Values land in PromQL string literals, so quotes and backslashes are escaped.
    assert r('x{split="$split"}', split='a"b\\') == 'x{split="a\\"b\\\\"}'


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_rendered_queries_parse_with_promtool(exprs: list[dict[str, str]], tmp_path: Path) -> None:
    # A recording-rule file is the offline way to have promtool parse PromQL.
    lines = ["groups:", "  - name: headwater_dashboard", "    rules:"]
    for i, r in enumerate(_rendered(exprs)):
        lines.append(f"      - record: headwater:dashboard_query_{i}")
        lines.append("        expr: '" + r.replace("'", "''") + "'")
    rules = tmp_path / "rules.yml"
    rules.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.run(
        ["promtool", "check", "rules", str(rules)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- (c)


def test_every_metric_is_exported(dash: dict[str, Any], exprs: list[dict[str, str]]) -> None:
    used: set[str] = set()
    for q in exprs:
        names = _metrics(q["expr"])
        assert names, q
        assert names <= KNOWN, f"{q['panel']}: not in metric_table(): {sorted(names - KNOWN)}"
        used |= names
    for v in dash["templating"]["list"]:
        if isinstance(v.get("query"), str):
            assert _metrics(v["query"]) <= KNOWN, v
    # One panel per signal: every exported metric is on the dashboard.
    assert used == KNOWN, f"not on the dashboard: {sorted(KNOWN - used)}"


def test_cluster_reductions(exprs: list[dict[str, str]]) -> None:
    for q in exprs:
        e = q["expr"]
        names = _metrics(e)
        outer = e.split("(", 1)[0].strip()
        for m in names & GAUGES:
            # A gauge is reduced across ranks as its metric-table row says.
            want = REDUCTION[m].lower()
            assert outer.startswith(want), f"{q['panel']}: {m} must be reduced with {want}: {e}"
        for m in names & COUNTERS:
            assert re.search(rf"(rate|increase)\({m}\{{", e), f"{q['panel']}: raw counter {e}"
            assert outer.startswith("sum") or outer == "max", f"{q['panel']}: {e}"
        for m in names & HISTOGRAMS:
            if f"{m}_bucket" in e:
                assert "sum by (le) (" in e, f"{q['panel']}: buckets not merged: {e}"
            if "histogram_quantile" in e:
                assert re.search(r"histogram_quantile\(0\.\d+, sum by \(le\) \(rate\(", e), e


# --------------------------------------------------------------------------- (d)


def test_panels_rows_and_titles(dash: dict[str, Any]) -> None:
    allp = dashboards.panels(dash)
    rows = [p["title"] for p in allp if p["type"] == "row"]
    assert rows == REQUIRED_ROWS
    titles = [p["title"] for p in allp if p["type"] != "row"]
    assert len(titles) == len(set(titles)), "panel titles must be unique"
    ids = [p["id"] for p in allp]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in allp:
        if p["type"] == "row":
            continue
        assert p.get("description"), f"{p['title']}: no description"
        assert "Healthy" in p["description"] and "Pathological" in p["description"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]


def test_grid_has_no_overlaps(dash: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_variables(dash: dict[str, Any]) -> None:
    by_name = {v["name"]: v for v in dash["templating"]["list"]}
    assert by_name["datasource"]["type"] == "datasource"
    assert by_name["datasource"]["query"] == "prometheus"
    rank = by_name["rank"]
    assert rank["type"] == "query"
    assert rank["query"] == "label_values(headwater_batches_delivered_total, rank)"
    assert rank["multi"] is True and rank["includeAll"] is True
    assert rank["allValue"] == ".*"
    split = by_name["split"]
    assert split["current"]["value"] == "train"
    assert {o["value"] for o in split["options"]} == {"train", "val", "test"}
    assert dash["uid"] == "headwater-sampler"
    assert dash["title"] == "headwater sampler"


def test_specific_panels(dash: dict[str, Any]) -> None:
    by_title = {p["title"]: p for p in dashboards.panels(dash)}
    for t in ("Duplicate seeds (time range)", "Temporal leaks (time range)"):
        p = by_title[t]
        assert p["type"] == "stat"
        steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps == [{"color": "green", "value": None}, {"color": "red", "value": 1}]
        assert "[$__range]" in p["targets"][0]["expr"]
    for t in ("BFS depth (hops)", "BFS sequence rows", "Padding fraction"):
        p = by_title[t]
        assert p["type"] == "heatmap"
        assert p["targets"][0]["format"] == "heatmap"
    mix = by_title["Task mix (seeds drawn/s by task)"]
    assert mix["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] in ("normal", "percent")
    for t in ("Data-wait share per rank", "Data-wait share (worst rank)"):
        assert by_title[t]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    for s in ("bfs", "assemble", "collate", "total"):
        p = by_title[f"Stage latency: {s}"]
        assert p["fieldConfig"]["defaults"]["unit"] == "s"
        assert [t["expr"].split(",")[0] for t in p["targets"]] == [
            "histogram_quantile(0.5",
            "histogram_quantile(0.95",
        ]
