"""A mixture of three databases with different schemas, for the mixture test
and for ``headwater bench``.

``python tests/python/three_schemas.py OUT_DIR`` writes under ``OUT_DIR``
(hash embedder throughout, since a mixture needs one embedder):

* the default TPC-H SF 0.01 database (``default_database(embedder="hash")``,
  built once in ``$HEADWATER_CACHE_DIR``),
* ``small/``: the tests' users / items / events database written in
  RelBench layout (``manifest.yaml``, ``db/*.parquet``, the ``user_churn``
  task with stored splits),
* ``library/``: a SQLite library of its own (members, books, loans; keys
  from the declared constraints, two tasks from :data:`LIBRARY_SCHEMA`),

and ``OUT_DIR/mix.toml`` listing the three (equal weights); then
``headwater bench OUT_DIR/mix.toml`` measures the mixture. The test uses
:func:`write_three_schema_mixture` with the session's TPC-H database.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import sys
from pathlib import Path

import numpy as np
from conftest import SmallData, _labels, _small_tables, _write_relbench

import headwater
from headwater.mixture import MixtureEntry, write_mixture

N_MEMBERS, N_BOOKS, N_LOANS = 60, 80, 300
GENRES = ["novel", "poetry", "history", "science", "travel"]
CITIES = ["Lyon", "Porto", "Turku", "Cork"]

#: Time columns and tasks of the library (keys come from the constraints).
LIBRARY_SCHEMA = """
[tables.members]
time_column = "joined"
[tables.loans]
time_column = "loaned_at"

[[tasks]]
name = "loan_returned_late"
anchor_table = "loans"
target_stype = "boolean"
column = "returned_late"

[[tasks]]
name = "book_genre"
anchor_table = "books"
target_stype = "categorical"
column = "genre"
"""
LIBRARY_TASKS = ["loan_returned_late", "book_genre"]


def write_library_sqlite(path: Path, seed: int = 3) -> Path:
    """A small SQLite library: ``members``, ``books`` and ``loans`` (foreign
    keys to both, a loan timestamp, a loan length and a late flag)."""
    rng = np.random.default_rng(seed)
    base = dt.datetime(2023, 1, 1, 9, 0, 0)
    sq = sqlite3.connect(str(path))
    sq.execute(
        "CREATE TABLE members (member_id INTEGER PRIMARY KEY, city TEXT, "
        "joined TIMESTAMP, premium BOOLEAN)"
    )
    sq.execute(
        "CREATE TABLE books (book_id INTEGER PRIMARY KEY, genre TEXT, pages INTEGER, "
        "price REAL)"
    )
    sq.execute(
        "CREATE TABLE loans (loan_id INTEGER PRIMARY KEY, "
        "member_id INTEGER REFERENCES members(member_id), "
        "book_id INTEGER REFERENCES books(book_id), loaned_at TIMESTAMP, days REAL, "
        "returned_late BOOLEAN)"
    )
    sq.executemany(
        "INSERT INTO members VALUES (?, ?, ?, ?)",
        [
            (i, CITIES[i % 4], (base + dt.timedelta(days=i)).isoformat(sep=" "), i % 3 == 0)
            for i in range(1, N_MEMBERS + 1)
        ],
    )
    sq.executemany(
        "INSERT INTO books VALUES (?, ?, ?, ?)",
        [
            (i, GENRES[i % 5], int(rng.integers(80, 900)), round(float(rng.uniform(5, 60)), 2))
            for i in range(1, N_BOOKS + 1)
        ],
    )
    loans = []
    for i in range(1, N_LOANS + 1):
        days = float(rng.integers(1, 40))
        when = base + dt.timedelta(days=int(rng.integers(60, 400)), seconds=int(rng.integers(0, 86400)))
        loans.append(
            (
                i,
                int(rng.integers(1, N_MEMBERS + 1)),
                int(rng.integers(1, N_BOOKS + 1)),
                when.isoformat(sep=" "),
                days,
                days > 21,
            )
        )
    sq.executemany("INSERT INTO loans VALUES (?, ?, ?, ?, ?, ?)", loans)
    sq.commit()
    sq.close()
    return path


def write_three_schema_mixture(out: Path, tpch_db: Path, data: SmallData) -> Path:
    """Preprocess the RelBench-layout and SQLite databases under ``out``
    (hash embedder), and write ``out/mix.toml``: ``tpch_db``, ``small``,
    ``library``, equal weights. Returns the mixture file."""
    out.mkdir(parents=True, exist_ok=True)
    relbench = _write_relbench(out / "small_relbench", data)
    headwater.preprocess(relbench, out / "small", embedder="hash", progress=False)
    lib = write_library_sqlite(out / "library.sqlite")
    schema = out / "library_schema.toml"
    schema.write_text(LIBRARY_SCHEMA, encoding="utf-8")
    headwater.preprocess(lib, out / "library", schema=schema, embedder="hash", progress=False)
    entries = [MixtureEntry(p) for p in (tpch_db, out / "small", out / "library")]
    return write_mixture(entries, out / "mix.toml")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    from headwater.data.default_db import default_database

    tpch = default_database(embedder="hash", progress=False)
    tables = _small_tables()
    mix = write_three_schema_mixture(
        Path(argv[0]), tpch, SmallData(tables=tables, labels=_labels(tables))
    )
    print(f"wrote {mix}; measure it with: headwater bench {mix}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
