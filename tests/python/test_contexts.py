"""In-context contexts from Python (docs/contexts.md): the recipe keys on
the ``Sampler``, their telemetry rows in the drain, the config errors, and
``headwater bench --examples`` / ``--sampler-set`` (the Rust tests check the
tier rules and determinism)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import headwater

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
RECIPE = {
    "examples": True,
    "local_context_sizes": [8, 16],
    "bfs_widths": [2, 4],
    "num_walks": 50,
    "walk_length": 4,
    "task_weights": {"event_amount_next": 0.0},
}


def test_examples_fill_contexts_and_report_their_rows() -> None:
    with headwater.Sampler(
        GOLDEN, default_batch_size=4, default_sequence_length=32, num_threads=1, **RECIPE
    ) as s:
        b = s.next_train_batch()
        assert b["is_target"].reshape(4, 32)[:, 0].all(), "the seed's target leads each sequence"
        d = s.drain_step_metrics()
    cells = sum(d[f"sampler/context/tier{t}_cells"] for t in range(3))
    assert cells == int((b["is_padding"] == 0).sum())
    assert d["sampler/context/tier0_cells"] > 0
    assert d["sampler/context/walk_steps"] > 0
    assert d["sampler/context/deadline_hits"] == 0
    assert d["sampler/invariants/temporal_leaks"] == 0


def test_examples_on_a_query_task_is_a_config_error_naming_examples() -> None:
    with pytest.raises(headwater.ConfigError) as ei:
        headwater.Sampler(GOLDEN, examples=True, default_sequence_length=1024)
    assert ei.value.key == "examples" and "event_amount_next" in str(ei.value)


def test_a_generated_lending_database_fills_its_in_context_sequences(tmp_path: Path) -> None:
    """The lending generator writes what it says (a loan is late when it
    lasts over ``LOAN_DAYS``; it is back ``days`` after it left; a review
    follows its return), and with RT-J's recipe the sequences of its two
    tasks whose tables hold enough labelled rows end in at most 5 %
    padding (tier 2 fills to ``S``; the Rust tests check the exact rule)."""
    import sqlite3
    from datetime import datetime

    import numpy as np

    from headwater.data.lending import LOAN_DAYS, write_lending

    src, schema = write_lending(tmp_path / "src", loans=3000, seed=1)
    sq = sqlite3.connect(src)
    loans = sq.execute("SELECT loaned_at, days, returned_at, returned_late FROM loans").fetchall()
    assert len(loans) == 3000 and 0 < sum(r[3] for r in loans) < 3000
    for at, days, back, late in loans:
        assert late == (days > LOAN_DAYS)
        gap = datetime.fromisoformat(back) - datetime.fromisoformat(at)
        assert abs(gap.total_seconds() - days * 86400) < 1
    late_reviews = sq.execute(
        "SELECT count(*) FROM reviews r JOIN loans l ON r.book_id = l.book_id "
        "AND r.member_id = l.member_id WHERE r.reviewed_at > l.returned_at"
    ).fetchone()[0]
    assert late_reviews > 0
    sq.close()
    headwater.preprocess(src, tmp_path / "db", schema=schema, embedder="hash", progress=False)
    s_len, pads = 256, {}
    with headwater.Sampler(tmp_path / "db", recipe="rt-j", default_batch_size=16,
                           default_sequence_length=s_len, num_threads=1,
                           task_weights={"book_genre": 0.0}) as s:
        names = [t["name"] for t in s.database_metadata()["tasks"]]
        for _ in range(6):
            b = s.next_train_batch()
            pad = b["is_padding"].reshape(16, s_len).mean(axis=1)
            for t, p in zip(b["seq_task_idx"], pad, strict=True):
                pads.setdefault(names[int(t)], []).append(float(p))
    assert set(pads) == {"author_country", "loan_returned_late"}
    assert all(np.mean(v) <= 0.05 for v in pads.values()), pads


def test_bench_times_the_rtj_recipe_and_sampler_sets() -> None:
    cmd = [sys.executable, "-m", "headwater.cli", "bench", str(GOLDEN), "--batch-size", "4",
           "--seq-len", "256", "--threads", "1", "--steps", "2", "--warmup", "1", "--examples",
           "--sampler-set", "num_walks=100", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    o = out["sampler_overrides"]
    assert o["examples"] is True and o["num_walks"] == 100 and o["walk_length"] == 20
    assert o["local_context_sizes"] == [256] and o["bfs_widths"] == [8, 16, 32, 64, 128, 256]
    assert o["task_weights"] == {"event_amount_next": 0.0}
    assert out["runs"][0]["batches_per_s"] > 0
    bad = subprocess.run([*cmd[:-1], "--sampler-set", "num_walks=-1"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode != 0 and "num_walks" in bad.stderr


RECALL_KEYS = {
    "task", "seeds", "with_examples", "k_mean", "recall", "recall_walks", "steps_per_context",
    "walks_steps_per_context", "contexts_per_cpu_s", "walks_contexts_per_cpu_s",
    "batches_per_cpu_s", "walks_batches_per_cpu_s",
}


def test_ranker_recall_is_one_against_itself_and_low_for_a_broken_ranker(tpch: Any) -> None:
    """``bench --ranker-recall``: its JSON per task, recall 1 for ``walks``
    on the reference's own generator, and low for ``shuffled`` (the walks'
    rows in a random order)."""
    from headwater.bench import run_ranker_recall

    sets = [
        "examples=true", "local_context_sizes=[32, 64]", "bfs_widths=[4, 8]", "num_walks=300",
        "walk_length=10", "prefer_latest=[false]", "default_sequence_length=256",
        "task_weights={order_num_lineitems = 0.0, customer_repeat_order_90d = 0.0}",
    ]
    cmd = [sys.executable, "-m", "headwater.cli", "bench", str(tpch.built.path), "--ranker-recall",
           "--ranker", "shuffled", "--seeds", "50", "--batch-size", "4",
           *[x for kv in sets for x in ("--sampler-set", kv)]]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ranker"] == "shuffled" and out["seeds"] == 50 and len(out["tasks"]) == 3
    for t in out["tasks"]:
        assert set(t) == RECALL_KEYS, t
        assert t["with_examples"] > 20 and t["k_mean"] >= 1
        assert t["recall"] < 0.2, t
        assert t["contexts_per_cpu_s"] > 0 and t["walks_steps_per_context"] > 0
    recipe = {k: v for k, v in out["sampler_overrides"].items()}
    same = run_ranker_recall(tpch.built.path, 50, "walks", 4, recipe, same_key=True)
    for t in same["tasks"]:
        assert t["with_examples"] > 20 and t["recall"] == 1.0, t


def test_expected_ranker_agrees_with_walks_as_well_as_walks_agrees_with_itself(tpch: Any) -> None:
    """``expected`` (the walks' expected visit counts, no walk drawn) picks
    the ``walks`` ranker's examples at least as often as an independent
    ``walks`` run does (the ceiling of any ranker that draws its own walks),
    and far more often than ``adaptive`` or the broken ``shuffled``."""
    from headwater.bench import run_ranker_recall

    recipe = {
        "examples": True, "local_context_sizes": [32], "bfs_widths": [4, 8], "num_walks": 2000,
        "walk_length": 10, "prefer_latest": [False, True], "default_sequence_length": 256,
        "task_weights": {"order_num_lineitems": 0.0, "customer_repeat_order_90d": 0.0},
    }
    runs = {r: run_ranker_recall(tpch.built.path, 400, r, 4, recipe)["tasks"]
            for r in ("expected", "adaptive", "shuffled")}
    for e, a, s in zip(runs["expected"], runs["adaptive"], runs["shuffled"], strict=True):
        assert e["with_examples"] > 300 and e["steps_per_context"] > 0, e
        assert e["recall"] >= e["recall_walks"] - 0.03, e
        assert e["recall"] > a["recall"] and e["recall"] > 3 * s["recall"], (e, a, s)


def test_recall_databases_script_writes_both_benchmark_databases(tmp_path: Path) -> None:
    """``scripts/recall_databases.py`` (the recall table's two generated
    databases) writes databases whose cell tasks the recall bench measures."""
    from headwater.bench import run_ranker_recall

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "recall_databases.py"), str(tmp_path),
                        "--scale", "1"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp_path / "library"), str(tmp_path / "small")]
    want = {"library": {"loan_returned_late", "book_genre"},
            "small": {"event_amount", "event_kind", "user_country", "item_in_stock"}}
    recipe = {"examples": True, "num_walks": 200, "default_sequence_length": 256,
              "local_context_sizes": [32, 64], "bfs_widths": [4, 8]}
    for name, tasks in want.items():
        db = tmp_path / name
        meta = json.loads(headwater.Database(str(db)).metadata_json())
        weights = {t["name"]: 0.0 for t in meta["tasks"] if t["name"] not in tasks}
        out = run_ranker_recall(db, 20, "expected", 4, {**recipe, "task_weights": weights or None})
        assert {t["task"] for t in out["tasks"]} == tasks
        assert all(t["with_examples"] > 0 and t["recall"] is not None for t in out["tasks"]), out
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "recall_databases.py"),
                          str(tmp_path / "x"), "--scale", "0"], capture_output=True, text=True,
                         check=False)
    assert bad.returncode != 0 and "--scale 0" in bad.stderr


def test_expected_store_writes_its_rankings_and_keeps_the_batches(tmp_path: Path) -> None:
    import shutil

    import numpy as np

    db = tmp_path / "golden"
    shutil.copytree(GOLDEN, db)
    recipe = {**RECIPE, "example_ranker": "expected", "num_walks": 500}

    def batches(store: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        with headwater.Sampler(db, default_batch_size=4, default_sequence_length=64,
                               num_threads=1, expected_store=store, **recipe) as s:
            got = [s.next_train_batch() for _ in range(3)]
            return got, s.drain_step_metrics()

    live, d_live = batches(False)
    assert not (db / "rankings").exists()
    stored, d = batches(True)
    assert len(list((db / "rankings").glob("expected-*.bin"))) == 1
    for a, b in zip(live, stored, strict=True):
        for k, v in a.items():
            if isinstance(v, np.ndarray):
                assert np.array_equal(v, b[k]), k
    assert d["sampler/context/walk_steps"] < d_live["sampler/context/walk_steps"]
    assert d["sampler/context/store_misses"] == 0 == d_live["sampler/context/store_misses"]


def test_the_processes_of_a_host_compute_one_store(tmp_path: Path) -> None:
    """Ranks that start together without the store: one computes it under
    the lock beside it, the others say they wait, then read it back, with
    the same batches."""
    import fcntl
    import shutil
    import time

    db = tmp_path / "golden"
    shutil.copytree(GOLDEN, db)
    recipe = {**RECIPE, "example_ranker": "expected", "num_walks": 500,
              "default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1,
              "expected_store": True}
    with headwater.Sampler(db, **recipe):
        pass
    (store,) = (db / "rankings").glob("expected-*.bin")
    store.unlink()  # as before any run: the key (its name) is now known
    child = (
        "import hashlib, sys, headwater\n"
        f"with headwater.Sampler({str(db)!r}, **{recipe!r}) as s:\n"
        "    h = hashlib.sha256()\n"
        "    for _ in range(2):\n"
        "        for k, v in sorted(s.next_train_batch().items()):\n"
        "            h.update(k.encode() + getattr(v, 'tobytes', lambda: repr(v).encode())())\n"
        "print(h.hexdigest())\n"
    )
    with open(store.with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is computing it
        errs = [tmp_path / f"rank{i}.err" for i in range(2)]
        procs = [
            subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                             stderr=e.open("w"), text=True)
            for e in errs
        ]
        deadline = time.monotonic() + 120
        while not all("waiting for it" in e.read_text() for e in errs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
                e.read_text() for e in errs
            ]
            time.sleep(0.05)
        assert not store.exists()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    text = [e.read_text() for e in errs]
    assert [p.returncode for p in procs] == [0, 0], text
    assert sum(t.count("items ranked in") for t in text) == 1, text
    assert outs[0] == outs[1] and len(outs[0].strip()) == 64, (outs, text)

    # Where neither the lock nor the store can be written: the key, the path.
    shutil.rmtree(db / "rankings")
    (db / "rankings").write_text("not a directory")
    with pytest.raises(headwater.ConfigError) as ei:
        headwater.Sampler(db, **recipe)
    msg = str(ei.value)
    assert "expected_store" in msg and "cannot be written" in msg, msg
    assert str(db / "rankings") in msg, msg


def test_the_walk_graph_is_one_file_the_processes_of_a_host_map(tmp_path: Path) -> None:
    """With examples on, the walk graph is built once per host into the
    database's ``walks/`` and mapped by every process: of three processes
    started together one builds it, all deliver the same batches; a damaged
    header or block table is refused at open and the file built again; a
    damaged record is found at its first read and fails the batch, naming
    the file and the block (deleting ``walks/`` builds it again); and a
    directory that cannot hold it costs only the sharing (the graph is
    built in the process's memory)."""
    import shutil
    import struct

    db = tmp_path / "golden"
    shutil.copytree(GOLDEN, db, ignore=shutil.ignore_patterns("walks"))  # as never opened
    kw = {**RECIPE, "default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1}
    child = (
        "import hashlib, sys, headwater\n"
        f"with headwater.Sampler({str(db)!r}, **{kw!r}) as s:\n"
        "    h = hashlib.sha256()\n"
        "    for _ in range(2):\n"
        "        for k, v in sorted(s.next_train_batch().items()):\n"
        "            h.update(k.encode() + getattr(v, 'tobytes', lambda: repr(v).encode())())\n"
        "print(h.hexdigest())\n"
    )

    def run(n: int, rc: int = 0) -> tuple[list[str], str]:
        procs = [
            subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for _ in range(n)
        ]
        got = [p.communicate(timeout=120) for p in procs]
        err = "".join(e for _, e in got)
        assert [p.returncode for p in procs] == [rc] * n, err
        return [o.strip() for o, _ in got], err

    outs, err = run(3)
    assert err.count("built the walk graph") == 1, err
    assert len(set(outs)) == 1 and len(outs[0]) == 64, outs
    (graph,) = (db / "walks").glob("graph-*.bin")

    again, err = run(1)
    assert again == outs[:1] and "walk graph" not in err, err  # mapped, not built

    data = bytearray(graph.read_bytes())
    data[60] ^= 0xFF  # the first block's checksum (the header is 56 bytes)
    graph.write_bytes(bytes(data))
    again, err = run(1)
    assert again == outs[:1], err
    assert "checksum mismatch" in err and str(graph) in err and "building it again" in err, err
    assert err.count("built the walk graph") == 1, err

    # A record: the records and the row offsets end the file, before the
    # padding to 8 and the hash; the golden graph's lie in one block, which
    # every walk reads.
    data = bytearray(graph.read_bytes())
    words, rows = struct.unpack_from("<2Q", data, 24)
    records = len(data) - 8 - 4 * ((words + rows) % 2) - 4 * (words + rows)
    data[records + 4 * 5] ^= 0xFF
    graph.write_bytes(bytes(data))
    _, err = run(1, rc=1)
    assert "FormatError" in err and str(graph) in err, err
    assert "corrupt data: block 1 of 2 " in err and "delete the database's `walks/`" in err, err
    assert "walk graph" not in err.split("FormatError")[0], err  # opened, not rebuilt
    shutil.rmtree(db / "walks")
    again, err = run(1)
    assert again == outs[:1], err
    assert err.count("built the walk graph") == 1, err

    shutil.rmtree(db / "walks")
    (db / "walks").write_text("not a directory")
    again, err = run(1)
    assert again == outs[:1], err
    assert "cannot be shared" in err and "in this process's memory" in err, err
