"""Build the golden format-v1 database under tests/data/golden_v1/.

Run once per format version (`python tests/data/make_golden_v1.py`); the Rust
integration tests open the committed result forever after, so a later build
that can no longer read v1 fails. The tiny source is generated here
deterministically; `golden_v1_expected.json` records source values computed
directly from that source (not from the writer) for the tests to compare.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import duckdb

import headwater

HERE = Path(__file__).parent


def build_source(d: Path) -> None:
    con = duckdb.connect()
    con.execute(
        """
        CREATE TABLE users AS SELECT * FROM (VALUES
            (1, 'alice', 31.5, TRUE,  'gold'),
            (2, 'bob',   NULL, FALSE, 'silver'),
            (3, 'carol', 22.0, NULL,  'gold'),
            (4, 'dave',  40.25, TRUE, NULL)
        ) t(user_id, name, age, active, tier);
        CREATE TABLE items AS SELECT * FROM (VALUES
            (10, 'red steel bolt', 2.5),
            (11, 'green paper cup', 0.75),
            (12, 'red steel bolt', 3.0)
        ) t(item_id, title, price);
        CREATE TABLE events AS SELECT * FROM (VALUES
            (100, 1, 10, TIMESTAMP '2024-01-01 10:00:00', 1.0),
            (101, 1, 11, TIMESTAMP '2024-01-02 11:30:00', 2.0),
            (102, 2, 10, TIMESTAMP '2024-01-03 09:15:00', NULL),
            (103, 3, 12, NULL, 4.0),
            (104, 9, 12, TIMESTAMP '2024-01-05 00:00:00', 5.0),
            (105, 1, NULL, TIMESTAMP '2024-01-06 23:59:59', 6.0)
        ) t(event_id, user_id, item_id, ts, amount);
        """
    )
    for t in ("users", "items", "events"):
        con.execute(f"COPY {t} TO '{d / (t + '.parquet')}' (FORMAT parquet)")
    (d / "schema.toml").write_text(
        """
[tables.users]
primary_key = "user_id"
[tables.users.columns]
name = "text"
tier = "categorical"

[tables.items]
primary_key = "item_id"
[tables.items.columns]
title = "text"

[tables.events]
primary_key = "event_id"
time_column = "ts"
foreign_keys = { user_id = "users", item_id = "items" }

[[tasks]]
name = "user_tier"
anchor_table = "users"
target_stype = "categorical"
column = "tier"

[[tasks]]
name = "event_amount_next"
anchor_table = "events"
target_stype = "numerical"
query = "SELECT event_id, ts, amount * 10 FROM events WHERE event_id < 104"
"""
    )


def main() -> None:
    out = HERE / "golden_v1"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        build_source(src)
        if out.exists():
            shutil.rmtree(out)
        headwater.preprocess(src, out, schema=src / "schema.toml", embedder="hash", progress=False)
    expected = {
        "format_version": 1,
        "tables": ["events", "items", "users"],
        "num_rows": 13,
        # events rows in source order: (user row, item row) or null; user 9 dangles.
        "event_parents": [[0, 0], [0, 1], [1, 0], [2, 2], [None, 2], [0, None]],
        "users_age": [31.5, None, 22.0, 40.25],
        "users_active": [True, False, None, True],
        "users_tier": ["gold", "silver", "gold", None],
        "items_title": ["red steel bolt", "green paper cup", "red steel bolt"],
        "events_ts_us": [1704103200000000, 1704195000000000, 1704273300000000, None, 1704412800000000, 1704585599000000],
        "tasks": ["user_tier", "event_amount_next"],
        "event_amount_next_targets": [10.0, 20.0, None, 40.0],
    }
    (HERE / "golden_v1_expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(headwater.Database(out).content_hash)


if __name__ == "__main__":
    main()
