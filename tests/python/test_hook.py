"""The Python telemetry hook (docs/telemetry.md): cross-rank reduction with JAX,
the in-step path, the W&B sink and ``StepHook``.

* Multi-process: 2 and 4 CPU processes (``hook_worker.py``, one per rank,
  ``JAX_PLATFORMS=cpu``) meet on a loopback coordinator with
  ``jax.distributed.initialize``. Each samples its own shard of ``hookdb`` (a
  database built here: ``tiny`` has ONE seed, so every rank but one has an
  empty pool for task ``tiny_x``; 13 hubs and 130 children split unevenly),
  consumes a per-rank number of batches per step (0 = it drains ``{}``; one
  step nobody consumes anything), and reduces with ``StepHook`` (host path;
  buffered with 2 processes, unbuffered with 4) and with ``reduce_in_step``
  inside a jitted ``shard_map`` (x64). The test checks the reduced dicts
  against a brute-force reduction of the per-rank drains written here, that
  every rank got identical dicts, that the host and in-step paths agree
  exactly, and reads rank 0's offline W&B run back from its ``.wandb`` file
  (``read_wandb.py``: the leveldb-style log of ``wandb_internal_pb2.Record``)
  to compare the logged history rows and the metric definitions.
* One process: the identity (plus siblings), buffered/unbuffered hook
  semantics, and the pack/unpack logic on a synthetic schema (sentinels,
  partial dicts, ties, merged-histogram percentiles); ``reduce_in_step`` on 4
  CPU devices of one process against the numpy reduction.

Nothing is written outside ``tmp_path``: W&B runs offline with its
directories under it, ``HEADWATER_CACHE_DIR`` too; subprocesses are killed
on failure or timeout.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import build_db_from_sql, child_env

from headwater import _native
from headwater import telemetry as T
from headwater.telemetry import WandbSink, summary_for

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # if this process imports JAX, CPU only

N: Any = _native
INF = math.inf
P = "sampler/"
HERE = Path(__file__).resolve().parent
WORKER = HERE / "hook_worker.py"
READ_WANDB = HERE / "read_wandb.py"
QUANTUM = 2.0**-30

# ----------------------------------------------------------------------------
# The database
# ----------------------------------------------------------------------------

HOOK_TASKS = ["tiny_x", "hub_v", "child_a"]
N_HUBS, N_CHILDREN = 13, 131
HOOK_SCHEMA = """
[tables.hub]
time_column = "t"
[tables.child]
time_column = "t"

[[tasks]]
name = "tiny_x"
anchor_table = "tiny"
target_stype = "numerical"
column = "x"

[[tasks]]
name = "hub_v"
anchor_table = "hub"
target_stype = "numerical"
column = "v"

[[tasks]]
name = "child_a"
anchor_table = "child"
target_stype = "numerical"
column = "a"
"""
T0 = "TIMESTAMP '2024-01-01'"
HOOK_SQL = [
    "CREATE TABLE tiny (id BIGINT PRIMARY KEY, x DOUBLE)",
    "INSERT INTO tiny VALUES (0, 1.5)",
    "CREATE TABLE hub (id BIGINT PRIMARY KEY, t TIMESTAMP, v DOUBLE)",
    f"INSERT INTO hub SELECT i, {T0} + INTERVAL 100 DAY, i FROM range({N_HUBS}) r(i)",
    (
        "CREATE TABLE child (id BIGINT PRIMARY KEY, hub_id BIGINT REFERENCES hub(id), "
        "t TIMESTAMP, a DOUBLE)"
    ),
    (
        f"INSERT INTO child SELECT i, i % {N_HUBS}, {T0} + INTERVAL (20 * (i // {N_HUBS})) DAY, "
        f"i * 0.5 FROM range({N_CHILDREN}) r(i)"
    ),
]
SAMPLER_KW: dict[str, Any] = {
    "default_batch_size": 4,
    "default_sequence_length": 32,
    "split_ratios": (1.0, 0.0, 0.0),
    "task_weights": [1.0, 1.0, 1.0],
    "bfs_child_width": 4,
    "max_hops": 2,
    "num_prefetch": 1,
}


@pytest.fixture(scope="module")
def hookdb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hookdb")
    return build_db_from_sql(root, "hook", HOOK_SQL, HOOK_SCHEMA, HOOK_TASKS)


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for s in made:
        s.shutdown()


def sampler(db: Path, closing: list[Any], **kw: Any) -> Any:
    s = N.Sampler(db, **{**SAMPLER_KW, **kw})
    closing.append(s)
    return s


# ----------------------------------------------------------------------------
# The brute-force reduction (independent of headwater.telemetry)
# ----------------------------------------------------------------------------


def quantile(
    edges: Sequence[float],
    counts: Sequence[float],
    q: float,
    mx: float,
    rule: str | None = "upper_edge",
) -> float:
    """crates/telemetry/src/hist.rs::quantile_from_buckets, transcribed (rule
    "midpoint": the middle of the bucket's lower and upper edges)."""
    total = sum(counts)
    if total == 0:
        return math.nan
    rank = max(math.ceil(q * total), 1)
    acc = 0.0
    for i, (e, c) in enumerate(zip(edges, counts, strict=True)):
        acc += c
        if acc >= rank:
            if not math.isfinite(e):
                return mx
            if rule == "midpoint":
                e = ((edges[i - 1] if i else 0.0) + e) / 2.0
            return min(e, mx)
    return mx


def brute_force(
    schema: list[dict[str, Any]], drains: list[dict[str, float]]
) -> tuple[dict[str, float], set[str]]:
    """(reduced dict, keys whose sums are fractional) of per-rank drains
    (``{}`` = the rank reported nothing), by the definitions in docs/telemetry.md."""
    if not any(drains):
        return {}, set()
    out: dict[str, float] = {}
    fractional: set[str] = set()
    for e in schema:
        k, red = e["key"], e["reduction"]
        if red == "MIN":
            vals = [d.get(k, INF) for d in drains]
            out[k] = min(vals)
            out[k + "_argmin_rank"] = vals.index(out[k])
        elif red == "MAX":
            vals = [d.get(k, -INF) for d in drains]
            out[k] = max(vals)
            out[k + "_argmax_rank"] = vals.index(out[k])
        elif red == "SUM":
            vals = [d.get(k, 0.0) for d in drains]
            out[k] = sum(vals)
            out[k + "_max"] = max(vals)
            out[k + "_argmax_rank"] = vals.index(out[k + "_max"])
            if any(v != int(v) for v in vals):
                fractional.add(k)  # _max is exact: the worst rank as drained
        else:
            edges = [INF if x is None else float(x) for x in e["edges"]]
            counts = [
                sum(d.get(f"{k}/bucket_{i:02}", 0.0) for d in drains) for i in range(len(edges))
            ]
            mx = max(d.get(k + "_max", -INF) for d in drains)
            out.update({f"{k}/bucket_{i:02}": c for i, c in enumerate(counts)})
            out[k + "_p50"] = quantile(edges, counts, 0.5, mx, e.get("quantile"))
            out[k + "_p95"] = quantile(edges, counts, 0.95, mx, e.get("quantile"))
            out[k + "_max"] = mx
    return out, fractional


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def mismatches(
    got: Mapping[str, float],
    want: Mapping[str, float],
    approx: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[str]:
    """Keys that differ; ``approx`` keys (fractional sums, rounded to
    multiples of 2**-30 per rank before the sum) within that rounding (and
    the float rounding of the brute-force sum)."""
    bad = [f"missing {k}" for k in want if k not in got]
    bad += [f"unexpected {k}" for k in got if k not in want]
    for k in want.keys() & got.keys():
        g, w = float(got[k]), float(want[k])
        if k in approx:
            if not math.isclose(g, w, rel_tol=1e-12, abs_tol=8 * QUANTUM):
                bad.append(f"{k}: got {g!r}, want {w!r}")
        elif not same(g, w):
            bad.append(f"{k}: got {g!r}, want {w!r}")
    return sorted(bad)


def identical(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Same keys in the same order, bit-identical values (NaN == NaN)."""
    return list(a) == list(b) and all(same(float(a[k]), float(b[k])) for k in a)


# ----------------------------------------------------------------------------
# Subprocesses
# ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def run_ranks(
    tmp_path: Path,
    cmds: list[list[str]],
    timeout: float,
    name: str = "rank",
    short_tmp: Path | None = None,
) -> list[str]:
    """Run one process per rank; kill them all if one fails or time runs
    out. Returns the stderr of each."""
    env = child_env(tmp_path, short_tmp)
    procs, errs = [], []
    try:
        for i, cmd in enumerate(cmds):
            err = open(tmp_path / f"{name}{i}.err", "wb")  # noqa: SIM115 - closed below
            errs.append(err)
            procs.append(
                subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT, env=env
                )
            )
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"{name} {failed[0]} failed" if failed else f"timed out after {timeout} s"
                logs = "\n".join(
                    f"--- {name} {i}:\n"
                    + (tmp_path / f"{name}{i}.err").read_text(errors="replace")[-3000:]
                    for i in range(len(procs))
                )
                pytest.fail(f"{why}\n{logs}")
            time.sleep(0.05)
        bad = [i for i, p in enumerate(procs) if p.returncode != 0]
        if bad:
            logs = (tmp_path / f"{name}{bad[0]}.err").read_text(errors="replace")[-3000:]
            pytest.fail(f"{name} {bad[0]} exited with {procs[bad[0]].returncode}:\n{logs}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for e in errs:
            e.close()
    return [(tmp_path / f"{name}{i}.err").read_text(errors="replace") for i in range(len(cmds))]


def plan(world: int) -> list[list[int]]:
    """Batches each rank consumes per step (0 = it drains ``{}``)."""
    return [
        [1] * world,  # everyone
        [0 if r == 1 else 2 for r in range(world)],  # rank 1 consumes nothing
        [3 if r == 0 else 1 for r in range(world)],
        [0] * world,  # nobody: every rank drains {} and nothing is logged
        [2 if r == world - 1 else 1 for r in range(world)],
    ]


def run_world(
    tmp_path: Path, short_tmp: Path, db: Path, world: int, buffered: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """(each rank's JSON, each rank's stderr)."""
    port = free_port()
    cmds = []
    for rank in range(world):
        cfg = {
            "rank": rank,
            "world": world,
            "port": port,
            "db": str(db),
            "sampler": {**SAMPLER_KW, "seed": 11 + rank},
            "plan": plan(world),
            "buffered": buffered,
            "wandb_dir": str(tmp_path / "wandb"),
            "out": str(tmp_path / f"rank{rank}.json"),
        }
        cmds.append([sys.executable, str(WORKER), json.dumps(cfg)])
    errs = run_ranks(tmp_path, cmds, timeout=150, short_tmp=short_tmp)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)], errs


# ----------------------------------------------------------------------------
# Multi-process tests
# ----------------------------------------------------------------------------


def _check_scenario(
    drained: list[list[dict[str, float]]], steps: list[list[int]], world: int
) -> None:
    """The scenario is what it claims: per-rank values differ (each rank has
    its own sampling seed, so its own task picks and pool positions; pools
    are global, so no rank owns a pool alone), a rank drained {} while others
    did not, and one step nobody reported."""
    for s, counts in enumerate(steps):
        for r in range(world):
            assert bool(drained[r][s]) == (counts[r] > 0), (s, r)
    pool_keys = [P + "pool/remaining_min", P + "pool/remaining_max", P + "mix/tv_distance"]
    assert any(
        len({drained[r][s][k] for r in range(world)}) > 1
        for s, counts in enumerate(steps)
        if all(counts)
        for k in pool_keys
    ), "the ranks' pool and mix figures never differ"


def _check_host_and_in_step(
    ranks: list[dict[str, Any]],
    drained: list[list[dict[str, float]]],
    steps: list[list[int]],
    schema: list[dict[str, Any]],
    reduced_keys: list[str],
    world: int,
) -> None:
    """The host path equals the brute force, the in-step path equals the
    host path bit for bit, on every rank."""
    logged_steps = []
    for s in range(len(steps)):
        want, fractional = brute_force(schema, [drained[r][s] for r in range(world)])
        for r in range(world):
            in_step = ranks[r]["in_step"][s]
            # Host path (what the hook logged for step s) == brute force.
            host = {step: m for step, m in ranks[r]["logged"]}.get(s, {})
            assert not mismatches(host, want, fractional), (
                s,
                r,
                mismatches(host, want, fractional)[:10],
            )
            if want:
                assert list(host) == reduced_keys
            # Host and in-step agree exactly; every rank has identical bits.
            assert identical(in_step, host), (s, r)
            assert identical(host, {st: m for st, m in ranks[0]["logged"]}.get(s, {})), (s, r)
        if want:
            logged_steps.append(s)
    assert logged_steps == [s for s, c in enumerate(steps) if any(c)]
    # Some outlier is not rank 0 (the argmin/argmax ranks are real).
    last = ranks[0]["logged"][-1][1]
    assert any(v > 0 for k, v in last.items() if k.endswith("_rank")), last


def _check_returned(
    ranks: list[dict[str, Any]], steps: list[list[int]], buffered: bool, world: int
) -> None:
    # What hook.step returned: this step's reduction, or the previous step's
    # when buffered (and the last one at flush).
    for r in range(world):
        logged = {st: m for st, m in ranks[r]["logged"]}
        expect = [logged.get(s, {}) for s in range(len(steps))]
        got = ranks[r]["returned"] + [ranks[r]["returned_at_close"]]
        want_returned = [{}, *expect] if buffered else [*expect, {}]
        assert len(got) == len(want_returned)
        assert all(identical(a, b) for a, b in zip(got, want_returned, strict=True)), r


@pytest.mark.parametrize(("world", "buffered"), [(2, True), (4, False)])
def test_multiprocess_reduction_matches_brute_force(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    hookdb: Path,
    world: int,
    buffered: bool,
) -> None:
    short_tmp = tmp_path_factory.mktemp("tmp")
    ranks, _stderr = run_world(tmp_path, short_tmp, hookdb, world, buffered)
    schema = ranks[0]["schema"]
    reduced_keys = ranks[0]["reduced_keys"]
    steps = plan(world)

    drained = [[d if d else {} for d in r["drained"]] for r in ranks]
    _check_scenario(drained, steps, world)
    _check_host_and_in_step(ranks, drained, steps, schema, reduced_keys, world)
    _check_returned(ranks, steps, buffered, world)

    # Ranks > 0 never touched their W&B run.
    for r in range(1, world):
        assert ranks[r]["fake_run_calls"] == []

    # Rank 0's offline W&B run, read back from the .wandb file.
    run_dir = Path(ranks[0]["wandb_run_dir"]).parent
    assert run_dir.is_relative_to(tmp_path)
    (wandb_file,) = run_dir.glob("run-*.wandb")
    read = subprocess.run(
        [sys.executable, str(READ_WANDB), str(wandb_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(tmp_path, short_tmp),
        check=False,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    wb = json.loads(read.stdout)
    rows = [row for row in wb["history"] if "trainer/step" in row]
    logged0 = ranks[0]["logged"]
    assert [row["trainer/step"] for row in rows] == [s for s, _ in logged0]
    for row, (s, want_row) in zip(rows, logged0, strict=True):
        got = {k: v for k, v in row.items() if k.startswith(P)}
        assert not mismatches(got, want_row), (s, mismatches(got, want_row)[:10])
    defs = wb["metrics"]
    assert "trainer/step" in defs
    assert defs[P + "*"]["step_metric"] == "trainer/step"
    for key in reduced_keys:
        assert defs[key]["step_metric"] == "trainer/step", key
    summary = {
        P + "pool/remaining_min": "min",
        P + "queue/depth_min": "min",
        P + "mix/tv_distance": "max",
        P + "pool/exhaust_events": "max",
        P + "pool/exhaust_events_max": "max",
        P + "invariants/temporal_leaks": "max",
        P + "tasks/hub_v": "mean",
        P + "pool/remaining_min_argmin_rank": "last",
        P + "tasks/hub_v_argmax_rank": "last",
        P + "bfs/rows_p95": "max",
        P + "stage/total_seconds_max": "max",
        P + "bfs/depth/bucket_00": "none",
    }
    for key, agg in summary.items():
        assert defs[key]["summary"] == [agg], (key, defs[key])
    assert defs[P + "bfs/depth/bucket_00"]["hidden"]
    assert not defs[P + "bfs/depth_p50"]["hidden"]
    assert not any(short_tmp.iterdir())  # wandb cleaned up its sockets


# ----------------------------------------------------------------------------
# One process
# ----------------------------------------------------------------------------


class ListSink:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.bound: Any = None

    def bind(self, schema: Any) -> None:
        self.bound = schema

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.rows.append((step, dict(metrics)))


def test_one_process_is_identity_plus_siblings(hookdb: Path, closing: list[Any]) -> None:
    pytest.importorskip("jax")
    s = sampler(hookdb, closing)
    schema = T.Schema.of(s)
    assert schema.keys == tuple(s.telemetry_keys())
    assert T.process_count() == 1
    for _ in range(3):
        s.next_train_batch()
    drained = s.drain_step_metrics()
    got = T.reduce(drained, s)
    assert list(got) == list(schema.reduced_keys)
    for k, v in drained.items():
        assert same(got[k], v), k
    for e in s.telemetry_schema():
        k = e["key"]
        if e["reduction"] == "SUM":
            assert got[k + "_max"] == got[k] and got[k + "_argmax_rank"] == 0
        elif e["reduction"] == "MIN":
            assert got[k + "_argmin_rank"] == 0
        elif e["reduction"] == "MAX":
            assert got[k + "_argmax_rank"] == 0
    # The packed drain, a Schema and the schema list give the same dict.
    s.next_train_batch()
    packed = s.drain_step_metrics_packed()
    via_packed = T.reduce(packed, schema)
    via_list = T.reduce(dict(zip(s.telemetry_keys(), packed.tolist(), strict=True)), s.telemetry_schema())
    assert identical(via_packed, via_list)
    assert T.reduce({}, schema) == {} and T.reduce(s.drain_step_metrics_packed(), schema) == {}


def test_step_hook_unbuffered_and_buffered(hookdb: Path, closing: list[Any]) -> None:
    s = sampler(hookdb, closing)
    sink = ListSink()
    hook = T.StepHook(s, sinks=[sink])
    assert isinstance(sink.bound, T.Schema)
    s.next_train_batch()
    first = hook.step(0)
    assert first and sink.rows == [(0, first)]
    assert hook.step(1) == {} and len(sink.rows) == 1  # nothing consumed: not logged

    b = sampler(hookdb, closing, seed=5)
    bsink = ListSink()
    with T.StepHook(b, sinks=[bsink], buffered=True) as bhook:
        b.next_train_batch()
        assert bhook.step(10) == {}  # step 10 is in flight
        assert bsink.rows == []
        b.next_train_batch()
        b.next_train_batch()
        r10 = bhook.step(11)  # logs and returns step 10
        assert bsink.rows == [(10, r10)] and r10[P + "batches"] == 1
    # Leaving the block flushed step 11.
    assert [st for st, _ in bsink.rows] == [10, 11] and bsink.rows[1][1][P + "batches"] == 2


# ----------------------------------------------------------------------------
# Pack / unpack on a synthetic schema (no sampler)
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def syn() -> list[dict[str, Any]]:
    return _native.telemetry_schema_for(["a", "b"], max_hops=2, sequence_length=16)


def random_drain(schema: list[dict[str, Any]], rng: np.random.Generator) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in schema:
        k = e["key"]
        if e["reduction"] == "HISTOGRAM":
            n = len(e["edges"])
            counts = rng.integers(0, 4, n)
            out.update({f"{k}/bucket_{i:02}": float(c) for i, c in enumerate(counts)})
            out[k + "_p50"] = out[k + "_p95"] = -1.0  # recomputed, never averaged
            out[k + "_max"] = float(rng.integers(0, 40)) / 2
        elif e["reduction"] == "SUM":
            out[k] = float(rng.integers(0, 4)) if "seconds" not in k else float(rng.uniform())
        else:  # few distinct values: ties between ranks
            out[k] = float(rng.integers(0, 3))
    return out


def test_reduce_matrix_matches_brute_force(syn: list[dict[str, Any]]) -> None:
    schema = T.Schema(syn)
    rng = np.random.default_rng(3)
    for trial in range(30):
        world = int(rng.integers(1, 7))
        drains = [random_drain(syn, rng) for _ in range(world)]
        for d in drains:
            if rng.random() < 0.3:
                d.clear()  # a rank that consumed no batch
            elif rng.random() < 0.3:  # a partial dict: missing keys are sentinels
                for k in list(d)[:: int(rng.integers(2, 9))]:
                    del d[k]
            elif rng.random() < 0.2:  # an empty-pool rank reports the Rust sentinels
                d[P + "pool/remaining_min"], d[P + "pool/remaining_max"] = INF, -INF
        m = np.stack([schema.pack_vector(d) for d in drains])
        got = schema.unpack(schema.reduce_matrix(m))
        want, fractional = brute_force(syn, drains)
        assert not mismatches(got, want, fractional), (trial, mismatches(got, want, fractional))


def test_pack_uses_sentinels_and_schema_order(syn: list[dict[str, Any]]) -> None:
    schema = T.Schema(syn)
    empty = schema.pack({})
    assert empty.reporting.tolist() == [0.0]
    assert np.all(empty.mins == INF) and np.all(empty.maxs == -INF)
    assert np.all(empty.counters == 0) and np.all(empty.buckets == 0)
    assert all(np.array_equal(a, b) for a, b in zip(schema.pack(None), empty, strict=True))
    partial = schema.pack({P + "queue/depth_min": 2.0, P + "batches": 1.0})
    assert partial.reporting.tolist() == [1.0]
    mins = dict(zip([e["key"] for e in syn if e["reduction"] == "MIN"], partial.mins, strict=True))
    assert mins[P + "queue/depth_min"] == 2.0 and mins[P + "pool/remaining_min"] == INF
    with pytest.raises(ValueError, match="packed drain has 3 values"):
        schema.pack(np.zeros(3))
    # One empty rank next to a reporting one changes nothing.
    rng = np.random.default_rng(0)
    d = random_drain(syn, rng)
    alone = schema.unpack(schema.reduce_matrix(schema.pack_vector(d)[None]))
    with_empty = schema.unpack(
        schema.reduce_matrix(np.stack([schema.pack_vector({}), schema.pack_vector(d)]))
    )
    for k, v in alone.items():
        if k.endswith("_rank"):
            assert with_empty[k] in (0.0, 1.0)
        else:
            assert same(with_empty[k], v), k
    assert schema.unpack(schema.reduce_matrix(np.stack([schema.pack_vector({})] * 3))) == {}


def test_merged_histogram_percentiles_are_not_averages() -> None:
    schema = T.Schema([{"key": P + "h", "reduction": "HISTOGRAM", "edges": [1.0, 2.0, 4.0, None]}])
    # hist.rs's own example: values 0.5 1 1.5 2 3 9.
    one = {
        P + "h/bucket_00": 2.0,
        P + "h/bucket_01": 2.0,
        P + "h/bucket_02": 1.0,
        P + "h/bucket_03": 1.0,
        P + "h_max": 9.0,
    }
    got = schema.unpack(schema.reduce_matrix(schema.pack_vector(one)[None]))
    assert (got[P + "h_p50"], got[P + "h_p95"], got[P + "h_max"]) == (2.0, 9.0, 9.0)
    # Rank 0: three values <= 1 (its p50 = its max 0.75); rank 1: one value
    # in (2, 4] (its p50 = its max 3.5). Merged buckets [3, 0, 1, 0]: p50 is
    # the first bucket's edge 1 (capped by the merged max 3.5, not by rank 0's
    # 0.75), p95 the merged max; the average of the rank p50s would be 2.125.
    r0 = {P + "h/bucket_00": 3.0, P + "h_max": 0.75}
    r1 = {P + "h/bucket_02": 1.0, P + "h_max": 3.5}
    m = np.stack([schema.pack_vector(r0), schema.pack_vector(r1)])
    got = schema.unpack(schema.reduce_matrix(m))
    assert (got[P + "h_p50"], got[P + "h_p95"], got[P + "h_max"]) == (1.0, 3.5, 3.5)
    assert [got[P + f"h/bucket_{i:02}"] for i in range(4)] == [3.0, 0.0, 1.0, 0.0]


def test_fractional_sums_are_exact_in_any_order(syn: list[dict[str, Any]]) -> None:
    """Counters are rounded to multiples of 2**-30 before the sum, so the
    total does not depend on the order the ranks are added in (a collective
    may add in any order) and the worst rank keeps its drained value."""
    schema = T.Schema(syn)
    rng = np.random.default_rng(9)
    vals = rng.uniform(0, 1e-3, 64)
    packed = np.stack([schema.pack_vector({P + "queue/wait_seconds": v}) for v in vals])
    key = P + "queue/wait_seconds"
    totals = set()
    for _ in range(20):
        perm = rng.permutation(len(vals))
        got = schema.unpack(schema.reduce_matrix(packed[perm]))
        totals.add(got[key])
        assert got[key + "_max"] == vals.max()
        assert got[key + "_argmax_rank"] == int(np.argmax(vals[perm]))
    assert len(totals) == 1  # bit-identical whatever the order
    assert math.isclose(totals.pop(), math.fsum(vals), rel_tol=0, abs_tol=64 * QUANTUM)


IN_STEP_DEVICES = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from headwater import telemetry as T

    syn, drains = json.loads(sys.stdin.read())
    schema = T.Schema(syn)
    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    packed = [schema.pack(d) for d in drains]
    stacked = T.Packed(*(np.stack(parts) for parts in zip(*packed)))
    fn = jax.jit(jax.shard_map(lambda p: T.reduce_in_step(p, "d"), mesh=mesh,
                               in_specs=P("d"), out_specs=P(), check_vma=False))
    red = fn(jax.device_put(stacked, NamedSharding(mesh, P("d"))))
    in_step = schema.unpack(T.Reduced(*(np.asarray(x) for x in red)))
    host = schema.unpack(schema.reduce_matrix(np.stack([schema.pack_vector(d) for d in drains])))
    print(json.dumps({"in_step": in_step, "host": host}))
    """
)


def test_in_step_matches_host_on_four_devices(tmp_path: Path, syn: list[dict[str, Any]]) -> None:
    pytest.importorskip("jax")
    rng = np.random.default_rng(21)
    drains = [random_drain(syn, rng) for _ in range(4)]
    drains[2] = {}
    del drains[1][P + "queue/depth_min"]
    proc = subprocess.run(
        [sys.executable, "-c", IN_STEP_DEVICES],
        input=json.dumps([syn, drains]),
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(tmp_path),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert identical(res["in_step"], res["host"])
    want, fractional = brute_force(syn, drains)
    assert not mismatches(res["host"], want, fractional)


# ----------------------------------------------------------------------------
# The W&B sink without W&B
# ----------------------------------------------------------------------------


class FakeRun:
    def __init__(self) -> None:
        self.defined: dict[str, dict[str, Any]] = {}
        self.logged: list[dict[str, Any]] = []

    def define_metric(self, name: str, **kw: Any) -> None:
        self.defined[name] = kw

    def log(self, row: dict[str, Any]) -> None:
        self.logged.append(row)


def test_wandb_sink_rank0_only_and_summaries(syn: list[dict[str, Any]]) -> None:
    schema = T.Schema(syn)
    off = FakeRun()
    other = WandbSink(off, rank=1)
    other.bind(schema)
    other.log({P + "batches": 1.0}, 3)
    assert off.defined == {} and off.logged == []

    run = FakeRun()
    sink = WandbSink(run, rank=0)
    sink.bind(schema)
    assert run.defined["trainer/step"] == {}
    assert run.defined[P + "*"] == {"step_metric": "trainer/step"}
    assert set(schema.reduced_keys) <= set(run.defined)
    kinds = {
        P + "pool/remaining_min": "min",
        P + "pool/remaining_max": "max",
        P + "pool/exhaust_events": "max",
        P + "pool/exhaust_events_max": "max",
        P + "tasks/a": "mean",
        P + "tasks/a_argmax_rank": "last",
        P + "bfs/rows_p50": "max",
        P + "bfs/rows/bucket_00": "none",
    }
    for k, agg in kinds.items():
        assert run.defined[k]["summary"] == agg, k
        assert summary_for(k) == agg, k  # the same from the name alone
    d = random_drain(syn, np.random.default_rng(1))
    sink.log(T.Schema(syn).identity(d), 7)
    assert run.logged[-1]["trainer/step"] == 7
    assert run.logged[-1][P + "batches"] == d[P + "batches"]
    sink.log({}, 8)
    assert len(run.logged) == 1
