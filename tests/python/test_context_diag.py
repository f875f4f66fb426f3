"""The in-context pathologies outside the diag matrix.

``diag_configs/context/label_window_ignored.toml`` on TPC-H: forecast
examples whose label windows are ignored (``debug_ignore_window``) light
exactly ``invariants/label_leaks``; the same run with the window kept
lights nothing.

``diag_configs/context/candidates_miss_positives.toml`` on a database
generated here, users buying items at random among 200 with a link task of
4 candidates per group: ``link/candidate_recall`` (what preprocessing
measured on the training groups) lights, and nothing else; the same data
with 200 candidates reads above the band's floor (the sampler-level pair,
without JAX), and a link context in context shows positive example labels.

``diag_configs/context/no_eligible_examples.toml`` on a database generated
here, a ``snapshots`` table whose rows all share one ``taken_at``. An example
must be dated strictly before its seed, so no context gets one:
``context/no_examples`` counts every sequence, and ``headwater diag`` lights
exactly that signal. The sampler-level pair (fires on the one-date table,
quiet when the dates spread over days) runs without JAX; the matrix's
``context_deadline`` config and its healthy run show the signal quiet in a
whole run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import build_db_from_sql

import headwater

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "diag_configs" / "context" / "no_eligible_examples.toml"
WINDOW = ROOT / "diag_configs" / "context" / "label_window_ignored.toml"
CANDIDATES = ROOT / "diag_configs" / "context" / "candidates_miss_positives.toml"

SCHEMA = """
[tables.stores]
primary_key = "store_id"
[tables.snapshots]
primary_key = "snap_id"
time_column = "taken_at"
foreign_keys = { store_id = "stores" }

[[tasks]]
name = "snapshot_grade"
anchor_table = "snapshots"
target_stype = "categorical"
column = "grade"
"""


def snapshots_db(root: Path, one_date: bool) -> Path:
    """20 stores, 2,000 snapshots, each with a grade; all taken at one time,
    or one per minute."""
    when = "TIMESTAMP '2024-01-01'" if one_date else "TIMESTAMP '2024-01-01' + i * INTERVAL 1 MINUTE"
    return build_db_from_sql(
        root,
        "snapshots",
        [
            "CREATE TABLE stores AS SELECT i AS store_id, 'r' || (i % 3) AS region "
            "FROM range(20) t(i)",
            "CREATE TABLE snapshots AS SELECT i AS snap_id, i % 20 AS store_id, "
            f"{when} AS taken_at, 'g' || (i % 4) AS grade, (i % 7) * 1.5 AS score "
            "FROM range(2000) t(i)",
        ],
        SCHEMA,
        ["snapshot_grade"],
    )


RECIPE = {
    "examples": True,
    "default_batch_size": 8,
    "default_sequence_length": 64,
    "local_context_sizes": [32, 48],
    "bfs_widths": [16],
    "num_walks": 200,
    "walk_length": 6,
    "num_threads": 1,
}


@pytest.mark.parametrize("one_date", [True, False])
def test_no_examples_counts_contexts_without_an_eligible_row(
    tmp_path: Path, one_date: bool
) -> None:
    db = snapshots_db(tmp_path, one_date)
    with headwater.Sampler(db, **RECIPE) as s:
        for _ in range(4):
            s.next_train_batch()
        d = s.drain_step_metrics()
    none, tier1, tier2 = (
        d["sampler/context/no_examples"],
        d["sampler/context/tier1_cells"],
        d["sampler/context/tier2_cells"],
    )
    assert d["sampler/context/deadline_hits"] == 0
    if one_date:
        assert none == 4 * 8 and tier1 == 0 and tier2 == 0, d
    else:  # a seed among the first minutes may have no earlier row: inside the band
        from headwater.diag.signals import SIGNALS

        assert none / (4 * 8) <= SIGNALS["context/no_examples"].healthy[1], d
        assert tier1 + tier2 > 0, d


def test_diag_lights_exactly_no_examples(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    from test_diag import lit, run_diag_cli

    from headwater import diag as D

    db = snapshots_db(tmp_path, one_date=True)
    spec, _ = D.load_spec(CONFIG)
    proc, result = run_diag_cli(tmp_path, CONFIG, db)
    assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + proc.stderr[-2000:]
    assert lit(result) == set(spec.expect) == {"context/no_examples"}


@pytest.mark.parametrize("ignored", [True, False])
def test_an_ignored_label_window_lights_exactly_label_leaks(
    tmp_path: Path, tpch: Any, ignored: bool
) -> None:
    pytest.importorskip("jax")
    from test_diag import lit, run_diag_cli

    args = () if ignored else ("--set", "sampler.debug_ignore_window=false")
    proc, result = run_diag_cli(tmp_path, WINDOW, tpch.built.path, *args)
    leaks = next(v for v in result["verdicts"] if v["signal"] == "invariants/label_leaks")
    # Filled in-context contexts light padding either way (the config says why).
    if ignored:
        assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + proc.stderr[-2000:]
        assert lit(result) == {"invariants/label_leaks", "padding/fraction_p50"}, result
    else:  # label_leaks stays dark: the run fails its declaration, and only padding lit
        assert proc.returncode == 1 and not result["ok"], proc.stdout[-3000:]
        assert lit(result) == {"padding/fraction_p50"} and leaks["value"] == 0, result



LINK_SCHEMA = """
[tables.users]
primary_key = "user_id"
time_column = "signup"
[tables.items]
primary_key = "item_id"
[tables.purchases]
primary_key = "purchase_id"
time_column = "ts"
foreign_keys = {{ user_id = "users", item_id = "items" }}
[[tasks]]
name = "buys"
anchor_table = "users"
destination_table = "items"
window = "7d"
candidates = {candidates}
eval_k = 2
query = \"\"\"
SELECT p.user_id, t.t, p.item_id
FROM (SELECT DISTINCT date_trunc('week', ts) AS t FROM purchases) t
JOIN purchases p ON p.ts > t.t AND p.ts <= t.t + INTERVAL 7 DAY
\"\"\"
"""


def random_purchases_db(root: Path, candidates: int) -> Path:
    """60 users, 200 items, 3,000 purchases of random items over 20 weeks;
    the link task `buys` (next week's purchases) with `candidates`."""
    return build_db_from_sql(
        root,
        "shop",
        [
            "CREATE TABLE users AS SELECT i AS user_id, TIMESTAMP '2024-01-01' AS signup, "
            "'r' || (i % 3) AS region FROM range(60) t(i)",
            "CREATE TABLE items AS SELECT i AS item_id, 'c' || (i % 7) AS category FROM range(200) t(i)",
            "CREATE TABLE purchases AS SELECT i AS purchase_id, hash(i, 1) % 60 AS user_id, "
            "hash(i, 2) % 200 AS item_id, TIMESTAMP '2024-01-02' + (hash(i, 3) % 3360) * INTERVAL 1 HOUR AS ts "
            "FROM range(3000) t(i)",
        ],
        LINK_SCHEMA.format(candidates=candidates),
        ["buys"],
    )


@pytest.mark.parametrize("candidates", [4, 200])
def test_candidate_recall_reads_what_the_candidates_hold(tmp_path: Path, candidates: int) -> None:
    from headwater.diag.signals import SIGNALS

    db = random_purchases_db(tmp_path, candidates)
    with headwater.Sampler(db, **RECIPE) as s:
        for _ in range(4):
            s.next_train_batch()
        d = s.drain_step_metrics()
    recall, floor = d["sampler/link/candidate_recall"], SIGNALS["link/candidate_recall"].healthy[0]
    assert d["sampler/task_kinds/link"] == 4 * 8
    if candidates == 4:  # a few of 200 items at random: ~4 % of the positives
        assert recall < 0.1, d
    else:  # the week's most bought, the user's past and random items: most of them
        assert floor <= recall < 1.0, d
    # In context, a link context shows its examples' labels, some positive.
    assert d["sampler/link/positive_examples"] > 0 and d["sampler/invariants/label_leaks"] == 0, d


def test_diag_lights_exactly_candidate_recall(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    from test_diag import lit, run_diag_cli

    from headwater import diag as D

    db = random_purchases_db(tmp_path, candidates=4)
    spec, _ = D.load_spec(CANDIDATES)
    proc, result = run_diag_cli(tmp_path, CANDIDATES, db)
    assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + proc.stderr[-2000:]
    assert lit(result) == set(spec.expect) == {"link/candidate_recall"}
