"""A generated lending database: authors, books, members, loans and
reviews, with times off any grid, for measuring in-context contexts where
the seed's table is small (authors) or where a row's outcome becomes known
only after its own time (a loan's length and late flag, known at its
return).

:func:`write_lending` writes a SQLite file (keys from its declared
constraints) and the schema that names its time columns and three cell
tasks: ``author_country`` (an undated table of a few hundred rows),
``book_genre`` and ``loan_returned_late``. A loan's ``returned_late``
follows from its length (``days`` over :data:`LOAN_DAYS`), and its
``returned_at`` is ``loaned_at`` plus ``days``: the time both outcomes
become known. Reviews come after their loan's return. The same arguments
write the same bytes.

``python -m headwater.data.lending OUT [--loans N] [--seed S] [--build]``
writes ``OUT/lending.sqlite`` and ``OUT/schema.toml`` (and with
``--build`` preprocesses them into ``OUT/db`` with the hash embedder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sqlite3
from pathlib import Path

#: A loan longer than this many days is late.
LOAN_DAYS = 21.0

_BASE = dt.datetime(2021, 1, 1)
_COUNTRIES = ("FR", "PT", "FI", "IE", "JP", "BR", "KE", "CA", "IN", "NZ")
_GENRES = ("novel", "poetry", "history", "science", "travel", "crime")

#: Time columns and tasks of the lending database (keys from constraints).
SCHEMA = """\
[tables.books]
time_column = "published"
[tables.members]
time_column = "joined"
[tables.loans]
time_column = "loaned_at"
[tables.reviews]
time_column = "reviewed_at"

[[tasks]]
name = "author_country"
anchor_table = "authors"
target_stype = "categorical"
column = "country"

[[tasks]]
name = "book_genre"
anchor_table = "books"
target_stype = "categorical"
column = "genre"

[[tasks]]
name = "loan_returned_late"
anchor_table = "loans"
target_stype = "boolean"
column = "returned_late"
label_time_column = "returned_at"   # known at the return, not at the loan
label_columns = ["days"]            # known with it
"""


def _at(seconds: float) -> str:
    return (_BASE + dt.timedelta(seconds=seconds)).isoformat(sep=" ")


def _create(sq: sqlite3.Connection) -> None:
    sq.execute("CREATE TABLE authors (author_id INTEGER PRIMARY KEY, country TEXT, born INTEGER)")
    sq.execute(
        "CREATE TABLE books (book_id INTEGER PRIMARY KEY, "
        "author_id INTEGER REFERENCES authors(author_id), genre TEXT, pages INTEGER, "
        "published TIMESTAMP)"
    )
    sq.execute(
        "CREATE TABLE members (member_id INTEGER PRIMARY KEY, city TEXT, joined TIMESTAMP)"
    )
    sq.execute(
        "CREATE TABLE loans (loan_id INTEGER PRIMARY KEY, "
        "book_id INTEGER REFERENCES books(book_id), "
        "member_id INTEGER REFERENCES members(member_id), loaned_at TIMESTAMP, "
        "days REAL, returned_at TIMESTAMP, returned_late BOOLEAN)"
    )
    sq.execute(
        "CREATE TABLE reviews (review_id INTEGER PRIMARY KEY, "
        "book_id INTEGER REFERENCES books(book_id), "
        "member_id INTEGER REFERENCES members(member_id), reviewed_at TIMESTAMP, "
        "rating INTEGER)"
    )


def write_lending(out: Path, loans: int = 20_000, seed: int = 0) -> tuple[Path, Path]:
    """Write ``out/lending.sqlite`` (``loans`` loans; authors, books,
    members and reviews in proportion) and ``out/schema.toml``; return
    both paths."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lending.sqlite"
    path.unlink(missing_ok=True)
    n_auth, n_books, n_mem = max(loans // 50, 10), max(loans // 5, 20), max(loans // 8, 20)
    span = 3 * 365 * 86400.0
    sq = sqlite3.connect(str(path))
    _create(sq)
    sq.executemany("INSERT INTO authors VALUES (?, ?, ?)", [
        (a, rng.choice(_COUNTRIES), rng.randint(1920, 2000)) for a in range(n_auth)
    ])
    published = [rng.uniform(-span, span * 0.8) for _ in range(n_books)]
    sq.executemany("INSERT INTO books VALUES (?, ?, ?, ?, ?)", [
        (b, rng.randrange(n_auth), rng.choice(_GENRES), rng.randint(60, 900), _at(published[b]))
        for b in range(n_books)
    ])
    joined = [rng.uniform(0, span * 0.9) for _ in range(n_mem)]
    sq.executemany("INSERT INTO members VALUES (?, ?, ?)", [
        (m, rng.choice(("Lyon", "Porto", "Turku", "Cork")), _at(joined[m])) for m in range(n_mem)
    ])
    rows: list[tuple[object, ...]] = []
    reviews: list[tuple[object, ...]] = []
    for i in range(loans):
        m, b = rng.randrange(n_mem), rng.randrange(n_books)
        start = max(joined[m], published[b]) + rng.uniform(0, span - max(joined[m], published[b]))
        days = round(rng.expovariate(1 / 16.0) + 1, 2)
        back = start + days * 86400.0
        rows.append((i, b, m, _at(start), days, _at(back), int(days > LOAN_DAYS)))
        if rng.random() < 0.25:
            reviews.append((len(reviews), b, m, _at(back + rng.uniform(600, 20 * 86400)),
                            rng.randint(1, 5)))
    sq.executemany("INSERT INTO loans VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    sq.executemany("INSERT INTO reviews VALUES (?, ?, ?, ?, ?)", reviews)
    sq.commit()
    sq.close()
    schema = out / "schema.toml"
    schema.write_text(SCHEMA)
    return path, schema


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m headwater.data.lending", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("out", type=Path, help="folder to write lending.sqlite and schema.toml to")
    ap.add_argument("--loans", type=int, default=20_000, help="loans (default: 20000)")
    ap.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    ap.add_argument("--build", action="store_true",
                    help="also preprocess it into OUT/db (hash embedder)")
    a = ap.parse_args(argv)
    path, schema = write_lending(a.out, a.loans, a.seed)
    print(path)
    if a.build:
        import headwater

        headwater.preprocess(path, a.out / "db", schema=schema, embedder="hash", progress=False)
        print(a.out / "db")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
