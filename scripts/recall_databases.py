"""Write the two generated databases of the ranker recall benchmark
(docs/contexts.md, "Measured").

The test suite's two small schemas, ``--scale`` times their rows (hash
embedder, preprocessed):

* ``OUT/library``: members, books and loans (``tests/python/three_schemas.py``;
  tasks ``loan_returned_late``, ``book_genre``);
* ``OUT/small``: users, items and events (``tests/python/conftest.py``, its
  time columns and cell tasks ``event_amount``, ``event_kind``,
  ``user_country``, ``item_in_stock``; query tasks follow at weight 0).

Usage, from the repository root::

    python scripts/recall_databases.py OUT [--scale 20]
    headwater bench OUT/library --examples --ranker-recall --ranker expected --seeds 1000

At ``--scale 20`` each has 1,000 seeds or more for the event and loan tasks
(800 users, 500 items). ``tests/python/test_contexts.py`` runs it at scale 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import conftest  # noqa: E402
import three_schemas  # noqa: E402

import headwater  # noqa: E402

# The users table's ids must stay below the dangling seller id the small
# schema plants (conftest.DANGLING_SELLER).
MAX_SCALE = (conftest.DANGLING_SELLER - 1) // conftest.N_USERS


def write(out: Path, scale: int) -> tuple[Path, Path]:
    """Write ``out/library`` and ``out/small`` at ``scale``; their paths."""
    if not 1 <= scale <= MAX_SCALE:
        raise SystemExit(f"--scale {scale}: allowed 1..{MAX_SCALE}")
    out.mkdir(parents=True, exist_ok=True)
    ts, cf = three_schemas, conftest
    ts.N_MEMBERS, ts.N_BOOKS, ts.N_LOANS = (n * scale for n in (ts.N_MEMBERS, ts.N_BOOKS, ts.N_LOANS))
    cf.N_USERS, cf.N_ITEMS, cf.N_EVENTS = (n * scale for n in (cf.N_USERS, cf.N_ITEMS, cf.N_EVENTS))
    lib_schema = out / "library_schema.toml"
    lib_schema.write_text(ts.LIBRARY_SCHEMA, encoding="utf-8")
    lib = ts.write_library_sqlite(out / "library.sqlite")
    headwater.preprocess(lib, out / "library", schema=lib_schema, embedder="hash", progress=False)
    tables = cf._small_tables()
    data = cf.SmallData(tables=tables, labels=cf._labels(tables))
    small_schema = out / "small_schema.toml"
    small_schema.write_text(cf.TIME_SCHEMA + cf.TASKS, encoding="utf-8")
    src = cf._write_duckdb(out / "small.duckdb", data)
    headwater.preprocess(src, out / "small", schema=small_schema, embedder="hash", progress=False)
    return out / "library", out / "small"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--scale", type=int, default=20, help="rows per table times this (default 20)")
    a = ap.parse_args(argv)
    for p in write(a.out, a.scale):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
