"""One definition per concept, checked against every surface: the sampler
config (``sampler_config_schema()``: stubs, docs, defaults, ranges,
unknown keys), the batch keys, and the latency quantile rule (accuracy of
single-rank and 4-rank merged quantiles against exact order statistics).

The metric-table check against the drain, ``telemetry_schema()``, a real
Prometheus and the Python reducer is in ``test_telemetry.py``
(``test_metric_table_agrees_with_every_surface``)."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import headwater
from headwater import _native
from headwater import telemetry as T

N: Any = _native
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
GOLDEN_TASKS = ["user_tier", "event_amount_next"]

# One bad value per key whose allowed values are a rule over several keys (a
# `rule` check); a new rule key must add a row. A key with a plain range, a
# bool or choices needs none: its bad values come from its check (`past`).
BAD: dict[str, dict[str, Any]] = {
    "rank": {"rank": 5},
    "split_ratios": {"split_ratios": [0.5, 0.1, 0.1]},
    "sequence_lengths": {"sequence_lengths": [], "tokens_per_batch": 1024},
    "tokens_per_batch": {"sequence_lengths": [512, 1536], "tokens_per_batch": 2048},
    "task_weights": {"task_weights": [1.0]},
    "database_weights": {"database_weights": [1.0, -1.0]},
    "telemetry_databases": {"telemetry_databases": ["a", "a"]},
    "stage_dir": {"stage_dir": ""},
    "local_context_sizes": {"examples": True, "local_context_sizes": []},
    "bfs_widths": {"examples": True, "bfs_widths": [2048]},
    "prefer_latest": {"examples": True, "prefer_latest": []},
    "prometheus_port": {"prometheus_port": 0},
    "prometheus_host": {"prometheus_port": 9000, "prometheus_host": "not-an-ip"},
    "otlp_endpoint": {"otlp_endpoint": 5},
    "stall_dump_dir": {"stall_dump_dir": ""},
    "debug_pin_cpu": {"debug_pin_cpu": 100000},
    "debug_cpu_hog": {"debug_cpu_hog": True},
}


def past(row: dict[str, Any]) -> list[Any]:
    """Values just outside a key's check: one past each end of a range (or
    of the type, read as the same range), a non-bool, an unknown choice."""
    c = row["check"]
    if c["kind"] == "int":
        return [c["lo"] - 1, c["hi"] + 1]
    if c["kind"] == "number":
        return [c["lo"] if c["open_lo"] else c["lo"] - 1, c["hi"] * 1.5 + 1]
    if c["kind"] == "bool":
        return ["yes", 3]
    if c["kind"] == "choices":
        return ["no-such-choice", 7]
    return [BAD[row["name"]]]


def schema() -> list[dict[str, Any]]:
    return N.sampler_config_schema()


def test_every_rule_key_and_only_those_has_a_bad_value_row() -> None:
    assert [f["name"] for f in schema() if f["check"]["kind"] == "rule"] == list(BAD)


@pytest.mark.parametrize("key", [f["name"] for f in N.sampler_config_schema()])
def test_a_bad_value_is_a_config_error_naming_key_value_and_range(key: str) -> None:
    field = next(f for f in schema() if f["name"] == key)
    for bad in past(field):
        config = bad if isinstance(bad, dict) else {key: bad}
        with pytest.raises(headwater.ConfigError) as ei:
            N.validate_sampler_config(config, GOLDEN_TASKS)
        msg = str(ei.value)
        assert f"`{key}`" in msg and field["range"] in msg, msg
        assert ei.value.key == key and ei.value.errors is None, msg
        assert isinstance(ei.value, ValueError) and isinstance(ei.value, headwater.HeadwaterError)


def test_every_bad_key_is_reported_at_once() -> None:
    bad = {"max_hops": 65, "default_batch_size": 0, "task_pick": "bogus", "seed_windows": 0}
    with pytest.raises(headwater.ConfigError) as ei:
        N.validate_sampler_config({**bad, "pool_fraction": 0.5})
    # A value of the wrong type is refused when the mapping is read, before
    # the ranges are checked: it is reported alone.
    assert ei.value.key == "task_pick" and ei.value.errors is None
    del bad["task_pick"]
    with pytest.raises(headwater.ConfigError) as ei:
        N.validate_sampler_config(bad)
    errors = ei.value.errors
    assert [e.key for e in errors] == ["default_batch_size", "max_hops", "seed_windows"]
    assert str(ei.value).startswith("3 bad config keys:")
    ranges = {f["name"]: f["range"] for f in schema()}
    for e in errors:
        assert isinstance(e, headwater.ConfigError) and e.value == str(bad[e.key])
        assert ranges[e.key] in e.what and f"`{e.key}`" in str(ei.value)
    assert (ei.value.key, ei.value.what) == (errors[0].key, errors[0].what)


def test_one_range_message_per_key_whatever_the_bad_value() -> None:
    msgs = []
    for v in (-1, 0, 70000, "x", 1.5):
        with pytest.raises(headwater.ConfigError) as ei:
            N.validate_sampler_config({"default_batch_size": v})
        msgs.append(str(ei.value))
    ranges = {m.split("allowed: ", 1)[1] for m in msgs}
    assert ranges == {"an integer in 1..=65536"}, msgs
    assert "got -1" in msgs[0] and "got 0" in msgs[1]


def test_step_shapes_are_the_cores_rule() -> None:
    """The trainer reads each step's (S, B) from the core, not from the keys."""
    fixed = {"default_batch_size": 8, "default_sequence_length": 256}
    assert N.step_shapes(fixed) == {"train": [{"S": 256, "B": 8}], "eval": {"S": 256, "B": 8}}
    varlen = {**fixed, "sequence_lengths": [512, 128], "tokens_per_batch": 2048}
    got = N.step_shapes(varlen)
    assert got["train"] == [{"S": 512, "B": 4}, {"S": 128, "B": 16}]
    assert got["eval"] == {"S": 256, "B": 8}
    with pytest.raises(headwater.ConfigError, match="tokens_per_batch"):
        N.step_shapes({**varlen, "tokens_per_batch": 1000})


def test_defaults_validate_and_round_trip() -> None:
    defaults = {f["name"]: f["default"] for f in schema()}
    assert N.validate_sampler_config({}) == defaults
    assert N.validate_sampler_config(defaults, GOLDEN_TASKS) == defaults
    s = N.Sampler(GOLDEN, config={"max_hops": 2}, default_batch_size=4)
    try:
        assert s.config() == {**defaults, "max_hops": 2, "default_batch_size": 4}
    finally:
        s.shutdown()


def test_unknown_key_is_rejected_naming_it() -> None:
    with pytest.raises(headwater.ConfigError, match="`bogus_key`"):
        N.validate_sampler_config({"bogus_key": 1})
    with pytest.raises(headwater.ConfigError, match="`bogus_key`"):
        N.Sampler(GOLDEN, bogus_key=1)
    with pytest.raises(headwater.ConfigError, match="`bogus_key`"):
        N.Sampler(GOLDEN, config={"bogus_key": 1})


def test_task_weights_by_name_and_unknown_task() -> None:
    got = N.validate_sampler_config({"task_weights": {"event_amount_next": 3}}, GOLDEN_TASKS)
    assert got["task_weights"] == [1.0, 3.0]
    with pytest.raises(headwater.ConfigError, match="no_such_task"):
        N.validate_sampler_config({"task_weights": {"no_such_task": 1.0}}, GOLDEN_TASKS)
    with pytest.raises(headwater.ConfigError, match="no_such_task"):
        N.Sampler(GOLDEN, task_weights={"no_such_task": 1.0})


def _stub_defaults() -> dict[str, Any]:
    tree = ast.parse((ROOT / "python/headwater/_native.pyi").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sampler")
    new = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__new__")
    a = new.args
    out = {x.arg: ast.literal_eval(d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d}
    out.update({x.arg: None for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None})
    return out


def _json(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def test_stub_signature_is_the_one_definition() -> None:
    stub = _stub_defaults()
    public = [f for f in schema() if f["group"] != "debug"]
    assert list(stub) == [f["name"] for f in public]
    assert {k: _json(v) for k, v in stub.items()} == {f["name"]: f["default"] for f in public}


def test_fault_injection_keys_are_out_of_the_stub_but_still_work() -> None:
    debug = [f["name"] for f in schema() if f["group"] == "debug"]
    assert debug and all(k.startswith("debug_") for k in debug)
    assert not set(debug) & set(_stub_defaults())
    got = N.validate_sampler_config({"debug_batch_delay_ms": 5.0})
    assert got["debug_batch_delay_ms"] == 5.0


def test_docs_sampler_defaults_are_the_one_definition() -> None:
    text = (ROOT / "docs" / "sampling.md").read_text()
    start = text.index("headwater.Sampler(")
    call = ast.parse(text[start : text.index(") as sampler:", start) + 1]).body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    shown = {kw.arg: ast.literal_eval(kw.value) for kw in call.value.keywords}
    defaults = {f["name"]: f["default"] for f in schema()}
    assert len(shown) >= 10, shown
    for k, v in shown.items():
        assert k in defaults, f"README shows unknown key {k}"
        assert _json(v) == defaults[k], (k, v, defaults[k])


def test_exceptions_importable_from_headwater_and_errors() -> None:
    from headwater import errors

    for name in (
        "HeadwaterError",
        "ConfigError",
        "FormatError",
        "SchemaError",
        "WorkerError",
        "ResourceError",
        "SamplerShutdown",
    ):
        assert getattr(headwater, name) is getattr(errors, name) is getattr(N, name)
        assert issubclass(getattr(errors, name), errors.HeadwaterError)
    assert headwater.Sampler is N.Sampler and headwater.Database is N.Database


# ----------------------------------------------------------------------------
# Latency quantiles
# ----------------------------------------------------------------------------


def _latency_schema() -> T.Schema:
    return T.Schema(N.telemetry_schema_for(["a"], 3, 64))


def _buckets(edges: np.ndarray, samples: np.ndarray) -> np.ndarray:
    # le semantics: bucket i holds edges[i-1] < v <= edges[i].
    return np.bincount(np.searchsorted(edges, samples, side="left"), minlength=len(edges))


@pytest.mark.parametrize("ranks", [1, 4])
def test_latency_quantiles_within_ten_percent_of_exact(ranks: int) -> None:
    """Lognormal latencies (median 1.2 ms, and per-rank shifts when merged):
    p50/p95 read from the (summed) buckets by the reducer's rule are within
    10 % of the exact quantiles of the pooled samples."""
    sch = _latency_schema()
    key = "sampler/stage/total_seconds"
    ent = next(e for e in sch.entries if e["key"] == key)
    assert ent["quantile"] == "midpoint"
    edges = np.array(ent["edges"])
    rng = np.random.default_rng(7)
    worst = 0.0
    for trial in range(20):
        per_rank = [
            rng.lognormal(math.log(1.2e-3) + 0.3 * r + 0.05 * trial, 0.6, 2000) for r in range(ranks)
        ]
        merged = sum(_buckets(edges, x) for x in per_rank)
        pooled = np.concatenate(per_rank)
        mx = pooled.max()
        i = sch.entries.index(ent)
        hist_index = [e for e in sch.entries if e["reduction"] == "HISTOGRAM"].index(ent)
        buckets = np.zeros(sch.n_buckets)
        start = sum(
            len(e["edges"]) for e in [e for e in sch.entries if e["reduction"] == "HISTOGRAM"][:hist_index]
        )
        buckets[start : start + len(edges)] = merged
        maxes = np.full(sch.n_hist, -np.inf)
        maxes[hist_index] = mx
        q = sch.quantiles(buckets, maxes)[hist_index]
        exact = np.quantile(pooled, [0.5, 0.95], method="inverted_cdf")
        err = np.abs(q / exact - 1.0)
        worst = max(worst, float(err.max()))
        assert (err <= 0.10).all(), (trial, q, exact, i)
    # The old power-of-two upper-edge rule is far off on the same data.
    assert worst <= 0.0625 + 0.01, worst


def test_python_reducer_quantiles_equal_the_native_drain() -> None:
    s = N.Sampler(GOLDEN, default_batch_size=4, default_sequence_length=32, num_threads=1)
    try:
        for _ in range(25):
            s.next_train_batch()
        d = s.drain_step_metrics()
        sch = T.Schema.of(s)
    finally:
        s.shutdown()
    vec, _ = sch.values(d)
    p = sch.pack(vec)
    q = sch.quantiles(p.buckets, p.maxs[sch.n_max_keys :])
    hists = [e["key"] for e in sch.entries if e["reduction"] == "HISTOGRAM"]
    for j, k in enumerate(hists):
        assert (q[j, 0], q[j, 1]) == (d[k + "_p50"], d[k + "_p95"]), k


def test_batch_keys_are_the_native_list() -> None:
    s = N.Sampler(GOLDEN, default_batch_size=2, default_sequence_length=16)
    try:
        b = s.next_train_batch()
    finally:
        s.shutdown()
    packing = ["segment_ids", "target_pos", "target_count", "segment_seeds"]
    per_seq = ["seq_task_idx", "seq_target_stype", "seq_cat_emb_start", "seq_cat_emb_count"]
    masked = ["is_masked", "mask_pos", "mask_count", "mask_cat_start", "mask_cat_count"]
    assert list(b) == [
        *N.BATCH_KEYS,
        "fingerprint",
        "seq_valid",
        *packing,
        "db_idx",
        *per_seq,
        "seq_db_idx",
        *masked,
    ]
    for one in ("task_idx", "target_stype", "cat_emb_start", "cat_emb_count", "db_idx"):
        assert (b[f"seq_{one}"] == b[one][0]).all(), f"a one-task batch: seq_{one} is {one}"
    assert list(b) == [t["name"] for t in N.batch_tensors()]
    assert b["target_count"].tolist() == [1, 1] and b["target_pos"].tolist() == [[0], [0]]
    assert b["seq_valid"].tolist() == [1, 1], "a training batch has no padded sequence"
    assert headwater.BATCH_KEYS == N.BATCH_KEYS and len(N.BATCH_KEYS) == 20


def test_the_exported_verdict_codes_are_the_trainers() -> None:
    """The trainer logs ``VERDICTS.index(v)``; the exporter's help text
    tells Prometheus users the same codes."""
    from headwater.train.verdict import VERDICTS

    (row,) = [g for g in headwater._native.trainer_gauges() if g["key"] == "trainer/verdict"]
    codes = ", ".join(f"{i} {v}" for i, v in enumerate(VERDICTS))
    assert row["help"].endswith(codes), (row["help"], codes)


# ----------------------------------------------------------------------------
# Metric keys: the diag signals and the dashboard name a table row once
# ----------------------------------------------------------------------------

PKG = ROOT / "python" / "headwater"
TABLE_KEYS = {r["key"] for r in N.metric_table()} | {g["key"] for g in N.trainer_gauges()}
#: Where a key may be spelled: the argument that names a row.
NAMING_CALLS = {"reduced", "culprit_of", "across", "increase", "quantile", "prom", "_heatmap"}
#: Keyword values that are words for people, not keys.
PROSE_KEYWORDS = {"what", "unit", "name"}
#: Text only the PromQL helpers and the reducer's suffix rule may hold.
DERIVED = ("headwater_", "_argmin_rank", "_argmax_rank", "_p50", "_p95")
PROMQL = ("min(", "max(", "sum(", " by (", "rate(", "increase(", "histogram_quantile")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            out.add(id(first.value))
    return out


def _pieces(source: str) -> list[tuple[str, str]]:
    """``(piece, where)`` for every string piece of ``source`` (f-string parts
    included) outside docstrings, prose keywords and the calls naming a row,
    with ``where`` = ``"named"`` for a row key in a naming position."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    named: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in PROSE_KEYWORDS:
            skip.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.keyword) and node.arg == "metric":
            named.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.Call):
            f = node.func
            fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if fname in NAMING_CALLS:
                for a in node.args:
                    named.update(id(n) for n in ast.walk(a))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CULPRIT_SUFFIX" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node.value))
    return [
        (n.value, "named" if id(n) in named else "other")
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def hand_restated(source: str, promql_allowed: bool = False) -> list[str]:
    """The string pieces of ``source`` that restate a metric key, a derived
    key or a reduction by hand instead of naming the table row."""

    def restated(piece: str, where: str) -> bool:
        if any(d in piece for d in DERIVED):
            return True
        if not promql_allowed and any(q in piece for q in PROMQL):
            return True
        keyish = where != "named" and not any(c.isspace() for c in piece)
        return keyish and any(k in piece for k in TABLE_KEYS)

    return [piece for piece, where in _pieces(source) if restated(piece, where)]


def test_signals_and_dashboard_name_each_metric_by_its_row_only() -> None:
    """A signal names its row (``metric=``) and a dashboard query its row
    key; the reduced key, the culprit sibling, the Prometheus name and the
    PromQL aggregation are derived (``diag.signals.reduced`` /
    ``culprit_of``, ``dashboards.widgets``)."""
    for path in [PKG / "diag" / "signals.py", PKG / "dashboards" / "panels.py"]:
        assert hand_restated(path.read_text(encoding="utf-8")) == [], path
    widgets = (PKG / "dashboards" / "widgets.py").read_text(encoding="utf-8")
    assert hand_restated(widgets, promql_allowed=True) == []


@pytest.mark.parametrize(
    "source",
    [
        'Signal(metric="pool/exhaust_events", rule=share(True, "x"))\nK = f"{P}pool/remaining_max"\n',
        'Signal(metric="queue/depth_min", culprit_key=f"{P}queue/depth_min_argmin_rank")\n',
        'series(rows, "sampler/padding/fraction_p50")\n',
        'Q(f"max(headwater_mix_tv_distance_ratio{SEL})", "cluster max")\n',
        'Q(f"min({prom(\'mix/tv_distance\')}{SEL})", "cluster min")\n',
        'Q(f"sum by (rank) ({rate})", "rank")\n',
    ],
)
def test_a_hand_restated_key_or_reduction_is_caught(source: str) -> None:
    assert hand_restated(source), source


def test_the_derived_keys_are_the_reducers() -> None:
    """Every signal's key and culprit key is one the Python reducer writes
    for a database (the per-task prefix: a prefix of its task keys)."""
    from headwater.diag import SIGNALS
    from headwater.telemetry import PREFIX

    sch = T.Schema(N.telemetry_schema_for(["a", "b"], 3, 64))
    keys = set(sch.reduced_keys) | {g["key"] for g in N.trainer_gauges()}
    for name, sig in SIGNALS.items():
        if sig.metric == "tasks/{task}":
            assert {f"{sig.key}a", f"{sig.key}b"} <= keys and sig.key == f"{PREFIX}tasks/", name
            continue
        assert sig.key in keys, (name, sig.key)
        if sig.culprit_key is not None:
            assert sig.culprit_key in keys, (name, sig.culprit_key)
