"""Link tasks (recommendation; docs/schema.md "Link tasks", docs/evaluation.md
"Ranking"): a RelBench ``recommendation`` task of the generated shop and a
schema link task over a DuckDB source become a seed-only pairs table (no
reverse edge leads into it, each pair dated when its label is known) and a
``link`` task whose seeds are its pairs, with the candidate rules held
(every pair is a candidate, no group is given a positive its candidates
missed, a training group keeps its positives and a fifth of its
negatives) and a sidecar aligned with the seeds; they sample in context with
no label leak; MAP@k is RelBench's, over whole groups only, with the
popularity baseline beside it; bad link declarations are refused naming the
task and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import relbench_metrics_module

import headwater
from headwater.data.shop import EVAL_K, TASK, WINDOW_DAYS, write_shop
from headwater.errors import SchemaError
from headwater.evaluation.ranking import ranking_metrics, score_links
from headwater.preprocessing import preprocess
from headwater.preprocessing.links import (
    PAST,
    POPULAR,
    RANDOM,
    LinkTable,
    pairs_table,
    read_link_table,
)
from headwater.preprocessing.schema import parse_schema

DAY_US = 86_400_000_000


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shop")
    folder = write_shop(root / "shop", users=90, items=240, per_user=14.0)
    return preprocess(folder, root / "db", embedder="hash", progress=False)


def _meta(db: Path) -> dict[str, Any]:
    return json.loads(headwater.Database(db).metadata_json())


def test_a_recommendation_task_becomes_seed_only_pairs_dated_at_their_window_end(shop: Path) -> None:
    meta = _meta(shop)
    (task,) = meta["tasks"]
    assert (task["name"], task["kind"], task["window_us"]) == (TASK, "link", WINDOW_DAYS * DAY_US)
    assert task["stored_splits"]
    pairs = next(t for t in meta["tables"] if t["name"] == pairs_table(TASK))
    assert pairs["seed_only"] and not any(t.get("seed_only") for t in meta["tables"] if t is not pairs)
    db = headwater.Database(shop)
    g, k = db.graph_arrays(), db.task_arrays(int(task["idx"]))
    lo, n = int(pairs["row_offset"]), int(pairs["num_rows"])
    # No reverse edge leads into a pair; each pair reaches its two rows.
    assert not np.any((g["rev_targets"] >= lo) & (g["rev_targets"] < lo + n))
    fwd = np.diff(g["fwd_offsets"])[lo : lo + n]
    assert np.all(fwd == 2)
    assert meta["num_reverse_edges"] == meta["num_edges"] - 2 * n
    # Seed i is pair i, observed at t and dated t + window.
    assert np.array_equal(k["anchor_row"], lo + np.arange(n))
    assert np.array_equal(g["row_time"][lo : lo + n], k["obs_time"] + WINDOW_DAYS * DAY_US)


def test_every_pair_is_a_candidate_and_training_groups_sample_their_negatives(shop: Path) -> None:
    meta = _meta(shop)
    n = int(meta["tasks"][0]["num_seeds"])
    t = read_link_table(shop, TASK, n)
    assert t.eval_k == EVAL_K
    k = headwater.Database(shop).task_arrays(0)
    assert np.array_equal(k["target"].astype(bool), t.linked)
    evaluated = t.split > 0
    assert evaluated.any() and (~evaluated).any()
    # No group is given a positive its candidates missed.
    assert np.all(t.origin & (PAST | POPULAR | RANDOM)), "a pair that is no candidate"
    found = np.bincount(t.group, weights=t.linked.astype(float))
    whole = np.bincount(t.group, weights=t.positives) / np.bincount(t.group)
    size = np.bincount(t.group)
    train, held = np.unique(t.group[~evaluated]), np.unique(t.group[evaluated])
    # The generator finds some of the positives, not all, in every split;
    # the training share is the task's stored candidate recall.
    for groups in (train, held):
        assert 0.2 < found[groups].sum() / whole[groups].sum() < 1.0
    stored = meta["tasks"][0]["candidate_recall"]
    assert stored == pytest.approx(found[train].sum() / whole[train].sum())
    # A training group keeps its positives and about a fifth of its negatives.
    neg_train = (size[train] - found[train]).mean()
    neg_held = (size[held] - found[held]).mean()
    assert 0.12 < neg_train / neg_held < 0.3, (neg_train, neg_held)
    # A wrong seed count is refused, naming the file.
    with pytest.raises(ValueError, match=r"links/.*parquet: .* rows, but task"):
        read_link_table(shop, TASK, n + 1)


def test_a_link_task_samples_in_context_without_a_label_leak(shop: Path) -> None:
    with headwater.Sampler(
        shop, default_batch_size=8, default_sequence_length=128, num_threads=1, examples=True,
        local_context_sizes=[16, 32], bfs_widths=[2, 4], num_walks=100, walk_length=6,
    ) as s:
        for _ in range(6):
            s.next_train_batch()
        d = s.drain_step_metrics()
    assert d["sampler/context/examples_per_sequence_p50"] > 0
    assert d["sampler/invariants/label_leaks"] == 0
    assert d["sampler/invariants/temporal_leaks"] == 0


SQL_LINK = """
[tables.users]
time_column = "signup"
[tables.events]
time_column = "ts"
[tables.items]
foreign_keys = { seller_id = "users" }
[[tasks]]
name = "bought"
anchor_table = "users"
destination_table = "items"
window = "7d"
candidates = 20
eval_k = 5
query = \"\"\"
SELECT e.user_id, t.t, e.item_id
FROM (SELECT DISTINCT date_trunc('week', ts) AS t FROM events) t
JOIN events e ON e.ts > t.t AND e.ts <= t.t + INTERVAL 7 DAY
\"\"\"
"""


def test_a_schema_link_task_splits_its_groups_by_time(
    tmp_path: Path, make_duckdb: Any
) -> None:
    src = make_duckdb(tmp_path / "small.duckdb")
    schema = tmp_path / "schema.toml"
    schema.write_text(SQL_LINK, encoding="utf-8")
    db = preprocess(src, tmp_path / "db", schema=schema, embedder="hash", progress=False)
    meta = _meta(db)
    task = next(t for t in meta["tasks"] if t["name"] == "bought")
    t = read_link_table(db, "bought", int(task["num_seeds"]))
    obs = headwater.Database(db).task_arrays(int(task["idx"]))["obs_time"]
    # Val and test groups come after every training group.
    assert obs[t.split == 0].max() < obs[t.split > 0].min()
    assert np.bincount(t.group)[np.unique(t.group[t.split > 0])].max() <= 20


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ('destination_table = "items"\nquery = "SELECT 1, 2, 3"', r"task `x`: a link task .* needs `window`"),
        ('destination_table = "items"\nwindow = "7d"', r"task `x`: a link task .* needs `query`"),
        ('destination_table = "items"\nwindow = "7 parsecs"\nquery = "SELECT 1"', r"task `x`\.window: '7 parsecs'"),
        ('destination_table = "items"\nwindow = "7d"\nquery = "q"\ntarget_stype = "numerical"',
         r"task `x`\.target_stype: a link task predicts .* \"boolean\""),
        ('destination_table = "items"\nwindow = "7d"\nquery = "q"\ncandidates = 5\neval_k = 10',
         r"task `x`\.eval_k: 10 is above `candidates` \(5\)"),
        ('target_stype = "boolean"\nquery = "q"\ncandidates = 5', r"task `x`\.candidates: only a link task"),
    ],
)
def test_bad_link_declarations_are_refused_naming_the_key(extra: str, match: str) -> None:
    import tomllib

    doc = tomllib.loads(f'[[tasks]]\nname = "x"\nanchor_table = "users"\n{extra}\n')
    with pytest.raises(SchemaError, match=match):
        parse_schema(doc)


def test_a_destination_without_a_primary_key_is_refused(tmp_path: Path, make_files: Any) -> None:
    root, _ = make_files(tmp_path / "files")
    schema = tmp_path / "schema.toml"
    link = SQL_LINK[SQL_LINK.index("[[tasks]]") :]
    schema.write_text(
        '[tables.users]\nprimary_key = "user_id"\ntime_column = "signup"\n'
        '[tables.events]\nprimary_key = "event_id"\ntime_column = "ts"\n'
        'foreign_keys = { user_id = "users" }\n' + link,
        encoding="utf-8",
    )
    with pytest.raises(SchemaError, match=r"task `bought`\.destination_table: table `items` has no primary key"):
        preprocess(root, tmp_path / "db", schema=schema, embedder="hash", progress=False)


def test_map_at_k_is_relbenchs(rng_seed: int = 7) -> None:
    rng = np.random.default_rng(rng_seed)
    k, groups = 10, 40
    sizes = rng.integers(3, 30, groups)
    group = np.repeat(np.arange(groups), sizes)
    linked = rng.random(len(group)) < 0.2
    scores = rng.random(len(group))
    # Positives the candidates missed count too.
    positives = np.bincount(group, weights=linked).astype(int) + rng.integers(0, 3, groups)
    positives = np.maximum(positives, 1)
    pred_isin = np.zeros((groups, k), dtype=int)
    for gi in range(groups):
        idx = np.flatnonzero(group == gi)
        top = idx[np.argsort(-scores[idx], kind="stable")][:k]
        pred_isin[gi, : len(top)] = linked[top]
    ours = ranking_metrics(scores, linked, group, positives[group], k)
    assert ours["map"] == pytest.approx(relbench_metrics_module().map(pred_isin, positives), rel=1e-12)
    assert ours["candidate_recall"] == pytest.approx(np.mean(np.bincount(group, weights=linked) / positives))


def _table(group: np.ndarray, linked: np.ndarray, positives: np.ndarray, pop: np.ndarray) -> LinkTable:
    z = np.zeros(len(group), np.int64)
    return LinkTable(group, positives, pop.astype(float), z.astype(float), z, linked, z, eval_k=2)


def test_score_links_ranks_whole_groups_only_beside_popularity() -> None:
    group = np.array([0, 0, 0, 1, 1, 1])
    linked = np.array([True, False, False, False, False, True])
    pop = np.array([1, 5, 3, 9, 1, 2])
    table = _table(group, linked, np.array([1, 1, 1, 2, 2, 2]), pop)
    # Perfect scores on group 0; group 1 is cut short (seed 5 not scored).
    r = score_links(np.array([0, 1, 2, 3, 4]), np.array([0.9, 0.1, 0.2, 0.5, 0.4]), table)
    assert r["count"] == 1 and r["metrics"]["map"] == 1.0
    assert r["baseline"]["map"] == 0.0  # popularity ranks seed 1, then 2, first
    whole = score_links(np.arange(6), np.array([0.9, 0.1, 0.2, 0.1, 0.2, 0.9]), table)
    assert whole["count"] == 2
    # Group 1 found one of its two positives at rank 1: AP@2 = 1 / min(2, 2).
    assert whole["metrics"]["map"] == pytest.approx((1.0 + 0.5) / 2)
    assert whole["metrics"]["candidate_recall"] == pytest.approx((1.0 + 0.5) / 2)


def test_the_link_context_picture_is_the_committed_one() -> None:
    """docs/task-kinds.md's link context, drawn again from a fresh build of
    the shop (``python -m headwater.context_picture`` redraws it)."""
    from headwater.context_picture import LINK_SVG, link_context_svg

    svg = link_context_svg()
    assert "seed: a (user, time, candidate item) pair" in svg and "label yes" in svg
    assert svg == (Path(__file__).parents[2] / LINK_SVG).read_text(encoding="utf-8")


def test_the_evaluation_warns_when_the_candidates_miss_the_positives() -> None:
    from headwater.evaluation.scoring import format_table

    group, linked = np.array([0, 0, 1, 1]), np.array([True, False, False, True])
    pop = np.array([1, 2, 3, 4])
    found = score_links(np.arange(4), np.array([0.9, 0.1, 0.2, 0.8]), _table(group, linked, np.ones(4, int), pop))
    assert found["metrics"]["candidate_recall"] == 1.0
    assert "warning" not in format_table({"val": {"bought": found}})
    # Each group's candidates hold one of its four positives.
    missed = score_links(np.arange(4), np.array([0.9, 0.1, 0.2, 0.8]), _table(group, linked, np.full(4, 4), pop))
    text = format_table({"val": {"bought": missed}})
    assert "warning: val bought: the candidates hold 25.0% of the positives (under 50%)" in text
