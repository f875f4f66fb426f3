"""``headwater diag``: the pathology × signal matrix, run for real.

Each config in ``diag_configs/`` is run with ``headwater diag`` (a real
``headwater train`` on the session's TPC-H database, 1 or 2 processes) and
must light exactly the signals it declares; the healthy config lights
nothing. The default run covers the whole matrix: the single-process
pathologies in one ``headwater diag`` call (one JAX start-up for all of
them), the two-rank ones on their own.

The healthy run is also scraped by a real Prometheus (Debian's package,
started here on loopback) every 0.5 s: every dashboard query returns data
for the run, and the per-step values logged to the offline W&B run, each
rank's drained values and Prometheus's counters agree.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Tpch, child_env, read_wandb_run, running_prometheus

pytest.importorskip("jax")
pytest.importorskip("wandb")
pytest.importorskip("matplotlib")

from headwater import diag as D
from headwater.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "diag_configs"
ALL = sorted(p.stem for p in CONFIGS.glob("*.toml"))


def run_diag_many(
    tmp: Path, configs: list[Path], db: Path, *args: str, timeout: float = 900
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]]]:
    """One ``headwater diag --json`` call over ``configs``: results by config stem."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "headwater.cli",
            "diag",
            *map(str, configs),
            "--db",
            str(db),
            "--dir",
            str(tmp / "runs"),
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        # Many steps of few shapes: optimised code (see TEST_XLA_FLAGS).
        env=child_env(tmp, optimised=True),
        check=False,
    )
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"config"')]
    assert len(rows) == len(configs), r.stdout[-3000:] + r.stderr[-3000:]
    return r, {Path(row["config"]).stem: row for row in rows}


def run_diag_cli(
    tmp: Path, config: Path, db: Path, *args: str, timeout: float = 600
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    r, results = run_diag_many(tmp, [config], db, *args, timeout=timeout)
    return r, results[config.stem]


def lit(result: dict[str, Any]) -> set[str]:
    return {v["signal"] for v in result["verdicts"] if v["lit"]}


# ----------------------------------------------------------------------------
# The healthy run, scraped by Prometheus
# ----------------------------------------------------------------------------


@dataclass
class Healthy:
    tmp: Path
    proc: subprocess.CompletedProcess[str]
    result: dict[str, Any]
    run_dir: Path
    prom: str
    start: float
    end: float
    plot: Path


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory, tpch: Tpch) -> Iterator[Healthy]:
    tmp = tmp_path_factory.mktemp("healthy")
    plot = tmp / "healthy.png"
    rules = ROOT / "dashboards" / "rules.yml"
    # The ranks take free ports ("auto") and Prometheus finds them through the
    # run's file_sd targets file: no hand-written scrape config.
    # (Prometheus globs only the file name, so the run's directory is named.)
    sd = str(tmp / "runs" / "healthy" / "prometheus_targets.json")
    with running_prometheus(tmp, [], interval="500ms", rules=rules, file_sd=sd) as prom:
        start = time.time()
        proc, result = run_diag_cli(
            tmp,
            CONFIGS / "healthy.toml",
            tpch.built.path,
            "--plot",
            str(plot),
            "--set",
            'logging.prometheus_port="auto"',
            "--set",
            "logging.prometheus_linger_s=4.0",
            "--set",
            'logging.wandb_mode="offline"',
            "--set",
            "logging.record_drains=true",
        )
        end = time.time()
        yield Healthy(tmp, proc, result, Path(result["run_dir"]), prom, start, end, plot)


def test_healthy_lights_nothing(healthy: Healthy) -> None:
    assert healthy.proc.returncode == 0, healthy.proc.stdout[-3000:]
    assert healthy.result["ok"] and lit(healthy.result) == set()
    assert {v["signal"] for v in healthy.result["verdicts"]} == set(D.SIGNALS)
    # The panels: a real PNG with one small multiple per signal.
    import matplotlib.image

    img = matplotlib.image.imread(healthy.plot)
    assert img.shape[0] > 400 and img.shape[1] > 800


def prom_range(h: Healthy, expr: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "start": h.start, "end": h.end + 2, "step": "1s"})
    with urllib.request.urlopen(f"{h.prom}/api/v1/query_range?{q}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def prom_instant(h: Healthy, expr: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr, "time": h.end + 2})
    with urllib.request.urlopen(f"{h.prom}/api/v1/query?{q}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def test_every_dashboard_query_returns_data(healthy: Healthy) -> None:
    dash = pytest.importorskip("headwater.dashboards")
    board = json.loads((ROOT / "dashboards" / "headwater.json").read_text())
    queries = dash.queries(board)
    assert len(queries) >= 20
    from headwater import _native as N

    # Per-database series exist for a mixture only (the healthy run samples
    # one database); tests/python/test_mixture.py checks them.
    per_db = {r["prometheus"] for r in N.metric_table() if r["per_database"]}
    empty = []
    for q in queries:
        expr = dash.render_expr(q["expr"], rank_regex=".*", split="train", rate_interval="5s")
        res = prom_range(healthy, expr)
        if not any(s["values"] for s in res) and not any(n in expr for n in per_db):
            empty.append((q["panel"], expr))
    assert not empty, empty
    # The recording rules: valid for promtool, and each one recorded data.
    rules = ROOT / "dashboards" / "rules.yml"
    from conftest import binary

    check = subprocess.run(
        [binary("promtool"), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    records = re.findall(r"^\s*- record: (\S+)", rules.read_text(), flags=re.MULTILINE)
    assert len(records) >= 5
    for name in records:
        assert any(s["values"] for s in prom_range(healthy, name)), name
    # Both ranks were scraped.
    ranks = prom_instant(
        healthy,
        'count by (rank) (max_over_time(headwater_batches_delivered_total{split="train"}[10m]))',
    )
    assert sorted(s["metric"]["rank"] for s in ranks) == ["0", "1"]
    # ... found through the run's file_sd targets file, with its labels.
    sd = json.loads((healthy.run_dir / "prometheus_targets.json").read_text())
    assert [g["labels"]["headwater_process"] for g in sd] == ["0", "1"]
    up = prom_instant(healthy, "max_over_time(up[10m])")
    found = {(s["metric"]["headwater_process"], s["metric"]["instance"]) for s in up}
    assert found == {(g["labels"]["headwater_process"], g["targets"][0]) for g in sd}
    assert all(s["metric"]["headwater_run"] == healthy.run_dir.name for s in up)


def test_the_input_verdict_is_exported_to_prometheus(healthy: Healthy) -> None:
    """Both ranks serve the verdict of the last logged row (``metrics.jsonl``)."""
    got = prom_instant(healthy, "last_over_time(headwater_trainer_verdict[10m])")
    by_rank = {s["metric"]["rank"]: float(s["value"][1]) for s in got}
    assert sorted(by_rank) == ["0", "1"], got
    rows = [r for r in _jsonl(healthy.run_dir / "metrics.jsonl") if "trainer/verdict" in r]
    assert set(by_rank.values()) == {rows[-1]["trainer/verdict"]}
    # The wait share is each rank's own; metrics.jsonl is rank 0's.
    share = prom_instant(
        healthy, 'last_over_time(headwater_trainer_data_wait_ratio{rank="0"}[10m])'
    )
    assert [float(s["value"][1]) for s in share] == [rows[-1]["trainer/data_wait_share"]]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_wandb_drains_and_prometheus_agree(healthy: Healthy) -> None:
    run = healthy.run_dir
    drains = [_jsonl(run / f"drains-rank{r}.jsonl") for r in range(2)]
    (s0,) = [json.loads((run / "rank-0.json").read_text())]
    wb = read_wandb_run(Path(s0["wandb_dir"]), child_env(healthy.tmp))
    rows = {int(r["trainer/step"]): r for r in wb["history"] if "sampler/batches" in r}
    steps = s0["steps"]
    assert sorted(rows) == list(range(steps))
    assert all(len(d) == steps for d in drains)

    # Step by step: W&B's row is the reduction of the two ranks' drains.
    schema = s0["telemetry_reductions"]
    for t in range(steps):
        a, b = drains[0][t], drains[1][t]
        assert a["step"] == b["step"] == t
        for key, red in schema.items():
            if red == "HISTOGRAM":
                continue
            want = {"SUM": a[key] + b[key], "MIN": min(a[key], b[key]), "MAX": max(a[key], b[key])}[
                red
            ]
            assert rows[t][key] == pytest.approx(want, rel=1e-9, abs=1e-9), (t, key)

    # Run totals: W&B sums == drained sums == Prometheus's final counters.
    def prom_total(metric: str, extra: str = "") -> float:
        res = prom_instant(healthy, f'sum(max_over_time({metric}{{split="train"{extra}}}[10m]))')
        return float(res[0]["value"][1]) if res else 0.0

    pairs = {
        "sampler/batches": "headwater_batches_delivered_total",
        "sampler/pool/exhaust_events": "headwater_pool_exhaust_events_total",
        "sampler/truncation/cells_dropped": "headwater_truncation_cells_dropped_total",
        "sampler/bfs/children_capped": "headwater_bfs_children_capped_total",
        "sampler/bfs/temporal_filtered": "headwater_bfs_temporal_filtered_total",
        "sampler/invariants/temporal_leaks": "headwater_invariant_temporal_leaks_total",
        "sampler/queue/wait_seconds": "headwater_queue_wait_seconds_sum",
    }
    tasks = [k.removeprefix("sampler/tasks/") for k in schema if k.startswith("sampler/tasks/")]
    for t in tasks:
        pairs[f"sampler/tasks/{t}"] = f"headwater_task_seeds_drawn_total|{t}"
    for key, metric in pairs.items():
        wb_total = sum(rows[t][key] for t in range(steps))
        drained = sum(d[key] for rank in drains for d in rank)
        name, _, task = metric.partition("|")
        prom = prom_total(name, f',task="{task}"' if task else "")
        # The reduction rounds counters to multiples of 2**-30 before summing
        # (exact sums in any order): sub-nanosecond for the wait seconds.
        assert wb_total == pytest.approx(drained, rel=1e-9, abs=2 * steps * 2.0**-30), key
        assert prom == pytest.approx(drained, rel=1e-6, abs=1e-6), (key, prom, drained)
    assert sum(rows[t]["sampler/batches"] for t in range(steps)) == 2 * steps


# ----------------------------------------------------------------------------
# Pathologies
# ----------------------------------------------------------------------------


def _processes(name: str) -> int:
    return D.load_spec(CONFIGS / f"{name}.toml")[0].processes


#: Pathologies made by the host, not the config alone (a cold page cache; a
#: slow sampler that is input_bound only while the host has CPU to spare: on
#: a loaded host its builds wait in the run queue and the verdict is, rightly,
#: cpu_starved): their lit set depends on the machine's load, so they run in
#: the slow matrix; tests/python/test_stalls.py proves their signals in
#: seconds. cpu_starved stays in the default matrix: its own hog starves the
#: sampler whatever the load.
HOST = ["cold_cache", "slow_sampler"]
PATHOLOGIES = [n for n in ALL if n != "healthy" and n not in HOST]
SINGLE = [n for n in PATHOLOGIES if _processes(n) == 1]


@pytest.fixture(scope="module")
def single_process_runs(
    tmp_path_factory: pytest.TempPathFactory, tpch: Tpch
) -> tuple[int, dict[str, dict[str, Any]]]:
    """Every single-process pathology, in one ``headwater diag`` call."""
    tmp = tmp_path_factory.mktemp("matrix")
    proc, results = run_diag_many(tmp, [CONFIGS / f"{n}.toml" for n in SINGLE], tpch.built.path)
    return proc.returncode, results


@pytest.fixture(scope="module")
def two_process_runs(
    tmp_path_factory: pytest.TempPathFactory, tpch: Tpch
) -> dict[str, tuple[int, dict[str, Any]]]:
    """Every two-rank pathology, each in its own ``headwater diag`` call, the
    calls side by side: their slow rank sleeps (``debug_batch_delay_ms``,
    seconds per batch) and the other waits for it, so the runs mostly wait
    and their signals (the slow rank's share of the wait, several times the
    healthy band) hold on a loaded host (see each config's comment)."""
    from concurrent.futures import ThreadPoolExecutor

    names = [n for n in PATHOLOGIES if n not in SINGLE]

    def one(name: str) -> tuple[int, dict[str, Any]]:
        tmp = tmp_path_factory.mktemp(name)
        proc, result = run_diag_cli(tmp, CONFIGS / f"{name}.toml", tpch.built.path)
        return proc.returncode, result

    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def _table(result: dict[str, Any]) -> str:
    return "\n".join(
        f"{v['signal']}: {v['value']} lit={v['lit']} ok={v['ok']} {v['why']}"
        for v in result["verdicts"]
    )


@pytest.mark.parametrize("name", PATHOLOGIES)
def test_pathology_lights_exactly_what_it_declares(
    tpch: Tpch,
    name: str,
    single_process_runs: tuple[int, dict[str, dict[str, Any]]],
    two_process_runs: dict[str, tuple[int, dict[str, Any]]],
) -> None:
    spec, _ = D.load_spec(CONFIGS / f"{name}.toml")
    assert spec.expect, f"{name} declares nothing to light"
    if name in SINGLE:
        status, results = single_process_runs
        result = results[name]
        assert (status == 0) == all(r["ok"] for r in results.values()), status
    else:
        status, result = two_process_runs[name]
        assert status == (0 if result["ok"] else 1)
    assert result["ok"], _table(result)
    assert lit(result) == set(spec.expect), _table(result)
    if name == "input_straggler":  # every lit signal names the slow rank
        culprits = {v["signal"]: v["culprit"] for v in result["verdicts"] if v["lit"]}
        assert culprits["verdict/input_straggler"] == 1 and set(culprits.values()) == {1}
    if name == "stuck_worker":
        _check_stall_dump(Path(result["run_dir"]))
    if name == "cross_rank_skew":
        culprits = {v["signal"]: v["culprit"] for v in result["verdicts"] if v["lit"]}
        assert set(culprits.values()) == {1}, culprits
        # The same rows judged as if healthy: every lit signal is a failure.
        spec, cfg = D.load_spec(CONFIGS / "healthy.toml")
        rows, _ = D.read_rows(Path(result["run_dir"]))
        ctx = D.context(cfg, spec, tpch.built.path)
        verdicts = D.evaluate(spec, rows, ctx)
        assert {v.signal for v in verdicts if not v.ok} == set(culprits)


@pytest.mark.slow
@pytest.mark.parametrize("name", HOST)
def test_host_pathology_lights_exactly_what_it_declares(
    tmp_path: Path, tpch: Tpch, name: str
) -> None:
    spec, _ = D.load_spec(CONFIGS / f"{name}.toml")
    proc, result = run_diag_cli(tmp_path, CONFIGS / f"{name}.toml", tpch.built.path)
    assert proc.returncode == (0 if result["ok"] else 1)
    assert result["ok"] and lit(result) == set(spec.expect), _table(result)


def _check_stall_dump(run_dir: Path) -> None:
    """The stuck worker's stack is on disk, found within 2x stall_after_ms,
    naming the function it is stuck in; Python's threads are dumped beside."""
    _, cfg = D.load_spec(CONFIGS / "stuck_worker.toml")
    want = cfg.sampler["debug_stall_step"], int(cfg.sampler["stall_after_ms"])
    (dump,) = sorted(run_dir.glob("stall-rank0-*.txt"))
    text = dump.read_text()
    m = re.search(r"in stage (\w+) of step (\d+) for (\d+) ms \(stall_after_ms (\d+)\)", text)
    assert m, text[:2000]
    stage, step, after, threshold = m[1], int(m[2]), int(m[3]), int(m[4])
    assert (stage, step, threshold) == ("bfs", *want), text[:500]
    assert threshold <= after < 2 * threshold, text[:500]
    stuck = next(ln for ln in text.splitlines() if ln.startswith("stuck in: "))
    assert "injected_stall" in stuck and "inject.rs" in stuck, stuck
    py = (run_dir / "python-stacks-rank0.txt").read_text()
    assert "Current thread" in py and "headwater/train" in py, py[:2000]


def test_every_pathology_in_the_matrix_is_covered() -> None:
    assert "healthy" in ALL and len(ALL) >= 8
    declared = set()
    for name in ALL:
        spec, _ = D.load_spec(CONFIGS / f"{name}.toml")
        declared |= set(spec.expect)
        assert spec.description
    # Configs outside the matrix (a generated database, killed processes) are
    # run by their own tests, each named after its config.
    for path in sorted(CONFIGS.glob("*/*.toml")):
        spec, _ = D.load_spec(path)
        declared |= set(spec.expect)
        tests = ROOT / "tests" / "python"
        assert any(path.name in t.read_text() for t in tests.glob("test_*.py")), path
    # Every signal is lit by some config (duplicate_seeds by its fault knob).
    assert set(D.SIGNALS) - declared == set()


def test_the_docs_table_lists_every_config() -> None:
    readme = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(\w+)`", readme, flags=re.MULTILINE))
    assert set(ALL) <= listed, sorted(set(ALL) - listed)


def test_mismatch_exits_non_zero(tmp_path: Path, tpch: Tpch) -> None:
    """A config declaring a signal its run cannot light fails the verdict.

    tiny_pools with the model and step count of the matrix's 40-step configs,
    whose compiled train and eval steps the session's compilation cache then
    holds (a larger model only keeps ``verdict/input_bound`` unlit: any
    further false positive fails the verdict too)."""
    text = (CONFIGS / "tiny_pools.toml").read_text()
    edits = {
        "steps = 60": "steps = 40",
        "d_model = 64": "d_model = 32",
        "num_layers = 2": "num_layers = 1",
        'signal = "pool/exhaust_events"': 'signal = "invariants/temporal_leaks"',
        "band = [0.8, 1.0]": "band = [1, inf]",
    }
    for old, new in edits.items():
        assert old in text, old  # the edit must apply
        text = text.replace(old, new)
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    proc, result = run_diag_cli(tmp_path, bad, tpch.built.path)
    assert proc.returncode == 1 and not result["ok"]
    v = {x["signal"]: x for x in result["verdicts"]}
    assert not v["invariants/temporal_leaks"]["ok"]
    assert not v["pool/exhaust_events"]["ok"]  # lit but now undeclared: a false positive
    assert "false positive" in v["pool/exhaust_events"]["why"]


@pytest.mark.parametrize(
    ("diag", "message"),
    [
        ('[[diag.expect]]\nsignal = "nope"\nband = [0, 1]\n', "unknown signal 'nope'"),
        (
            '[[diag.expect]]\nsignal = "mix/tv_distanc"\nband = [0, 1]\n',
            "unknown signal 'mix/tv_distanc' (did you mean `mix/tv_distance`?)",
        ),
        ("skp = 3\n", "unknown key `diag.skp` (did you mean `diag.skip`?)"),
        ('[[diag.expect]]\nsignal = "mix/tv_distance"\nband = [1, 0]\n', "band must be"),
        (
            '[[diag.expect]]\nsignal = "mix/tv_distance"\nband = [0, 1]\nculprit_rank = 0\n',
            "has no culprit rank",
        ),
        (
            '[[diag.expect]]\nsignal = "pool/remaining_min"\nband = [0, 1]\nculprit_rank = 3\n',
            "culprit_rank 3 is outside",
        ),
        (
            '[[diag.expect]]\nsignal = "mix/tv_distance"\nbnd = [0, 1]\n',
            "unknown key `bnd` (did you mean `band`?)",
        ),
        ('host_dependent = ["nope"]\n', "diag.host_dependent: unknown signal 'nope'"),
        ('host_dependent = "queue/wait_seconds"\n', "must be a list of signal names"),
        (
            'host_dependent = ["mix/tv_distance"]\n'
            '[[diag.expect]]\nsignal = "mix/tv_distance"\nband = [0, 1]\n',
            "'mix/tv_distance' is also declared in diag.expect",
        ),
    ],
)
def test_bad_diag_sections_are_errors(tmp_path: Path, diag: str, message: str) -> None:
    path = tmp_path / "d.toml"
    path.write_text("[diag]\nprocesses = 2\n" + diag)
    with pytest.raises(ConfigError) as e:
        D.load_spec(path)
    assert message in str(e.value) and str(path) in str(e.value)
