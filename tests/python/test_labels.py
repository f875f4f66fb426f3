"""Labels known later (docs/contexts.md, "Labels known later"): a cell task's
``label_time_column`` and ``label_columns`` on the generated lending
database, where a loan's ``returned_late``, ``days`` and ``returned_at`` are
known only at its return. Checked from the outside, cell by cell: the seed's
own outcomes never show, and every other loan of a context shows its
outcome only if it was back by the seed's time (its ``returned_at``,
decoded from the batch, against the seed's ``loaned_at``); the invariant
``invariants/label_leaks`` stays 0, and counts when the rule is off. The
schema errors name the task, the key and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import headwater
from headwater.data.lending import SCHEMA, write_lending

S, B = 256, 16
#: Seconds a timestamp decoded from its z-scored float may be off.
SLACK_S = 600.0


@pytest.fixture(scope="module")
def lending(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("lending")
    src, schema = write_lending(tmp / "src", loans=3000, seed=2)
    headwater.preprocess(src, tmp / "db", schema=schema, embedder="hash", progress=False)
    return tmp / "db"


def _loan_batches(db: Path, n: int, **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, float]]:
    weights = {"author_country": 0.0, "book_genre": 0.0, "loan_returned_late": 1.0}
    with headwater.Sampler(db, recipe="rt-j", default_batch_size=B, default_sequence_length=S,
                           num_threads=1, num_walks=500, task_weights=weights, **kw) as s:
        batches = [s.next_train_batch() for _ in range(n)]
        return batches, s.database_metadata(), s.drain_step_metrics()


def _seconds(b: dict[str, Any], meta: dict[str, Any]) -> np.ndarray:
    """Each cell's timestamp in seconds, decoded from its z-scored epoch."""
    st = meta["timestamp_stats"]
    z = b["timestamp_values"].reshape(B * S, -1)[:, -1].astype(np.float64)
    return (z * st["std_us"] + st["mean_us"]) / 1e6


def _outcomes(batches: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[int, int, int]:
    """(seed outcome cells shown, later outcomes shown, earlier outcomes
    shown) over every loan row of every sequence."""
    col = {c["name"]: c["idx"] for c in meta["columns"] if c["table"] == _loans(meta)}
    outcome = [col["returned_late"], col["days"], col["returned_at"]]
    seed_shown = later = earlier = 0
    for b in batches:
        ids = b["column_ids"].reshape(B * S)
        rows = b["seq_row_ids"].reshape(B * S)
        null = b["is_null"].reshape(B * S).astype(bool) | b["is_target"].reshape(B * S).astype(bool)
        secs = _seconds(b, meta)
        for q in range(B):
            cells = slice(q * S, (q + 1) * S)
            i, r, nl, t = ids[cells], rows[cells], null[cells], secs[cells]
            pad = b["is_padding"].reshape(B * S)[cells].astype(bool)
            seed_time = t[(r == 0) & (i == col["loaned_at"]) & ~pad][0]
            for row in np.unique(r[~pad & np.isin(i, outcome)]):
                at = (r == row) & ~pad
                shown = at & np.isin(i, outcome) & ~nl
                if row == 0:
                    seed_shown += int(shown.sum())
                elif shown.any():
                    back = t[at & (i == col["returned_at"]) & ~nl]
                    assert len(back) == 1, "an outcome shown without its return time"
                    later += int(back[0] > seed_time + SLACK_S)
                    earlier += int(back[0] <= seed_time)
    return seed_shown, later, earlier


def _loans(meta: dict[str, Any]) -> int:
    return next(t["idx"] for t in meta["tables"] if t["name"] == "loans")


def test_a_loan_shows_its_outcome_only_once_it_was_back(lending: Path) -> None:
    batches, meta, d = _loan_batches(lending, 6)
    seed_shown, later, earlier = _outcomes(batches, meta)
    assert seed_shown == 0, "the seed's own days or return time shows"
    assert later == 0, f"{later} loans show an outcome known after the seed's time"
    assert earlier > 0, "no loan of any context shows an outcome: the check proves nothing"
    assert d["sampler/invariants/label_leaks"] == 0
    assert d["sampler/invariants/temporal_leaks"] == 0
    assert d["sampler/context/tier1_cells"] > 0


def test_with_the_rule_off_the_leaks_are_shown_and_counted(lending: Path) -> None:
    batches, meta, d = _loan_batches(lending, 4, temporal_filter=False)
    seed_shown, later, _ = _outcomes(batches, meta)
    assert seed_shown > 0 and later > 0
    assert d["sampler/invariants/label_leaks"] > 0


def test_without_a_label_time_the_sibling_outcome_shows(tmp_path: Path) -> None:
    """The same database without the two keys: a loan's label is taken as
    known at the loan, so the seed's days (what the rule hides) show."""
    src, _ = write_lending(tmp_path / "src", loans=600, seed=2)
    plain = "\n".join(ln for ln in SCHEMA.splitlines() if not ln.startswith("label_"))
    (tmp_path / "plain.toml").write_text(plain)
    headwater.preprocess(src, tmp_path / "db", schema=tmp_path / "plain.toml", embedder="hash",
                         progress=False)
    batches, meta, d = _loan_batches(tmp_path / "db", 2)
    seed_shown, _, _ = _outcomes(batches, meta)
    assert seed_shown > 0
    assert d["sampler/invariants/label_leaks"] == 0  # the rule it was given holds


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('label_time_column = "days"', ["loan_returned_late", "label_time_column", "returned_at"]),
        ('label_time_column = "nope"', ["loan_returned_late", "label_time_column", "nope"]),
        ('label_columns = ["nope"]', ["loan_returned_late", "label_columns", "nope"]),
        ("label_columns = 3", ["loan_returned_late", "label_columns", "list"]),
    ],
)
def test_a_bad_label_key_names_the_task_the_key_and_what_is_allowed(
    tmp_path: Path, line: str, words: list[str]
) -> None:
    src, _ = write_lending(tmp_path / "src", loans=200, seed=2)
    key = line.split(" =")[0]
    bad = "\n".join(line if ln.startswith(key) else ln for ln in SCHEMA.splitlines())
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(headwater.SchemaError) as ei:
        headwater.preprocess(src, tmp_path / "db", schema=tmp_path / "bad.toml",
                             embedder="hash", progress=False)
    assert all(w in str(ei.value) for w in words), str(ei.value)
    assert not (tmp_path / "db").exists()


def test_a_sql_task_with_a_label_time_is_refused(tmp_path: Path) -> None:
    from headwater.preprocessing.schema import parse_schema

    doc = {"tasks": [{"name": "t", "anchor_table": "loans", "target_stype": "numerical",
                      "query": "SELECT 1", "label_time_column": "returned_at"}]}
    with pytest.raises(headwater.SchemaError, match=r"task `t`\.label_time_column: only a cell"):
        parse_schema(doc)
