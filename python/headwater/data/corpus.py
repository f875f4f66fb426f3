"""A generated corpus: many small relational sources of varied schemas and
sizes, for measuring what a corpus costs (preprocessing on one machine or
on Ray, sampling a mixture larger than memory) without downloading one.

:func:`generate_corpus` writes ``n`` SQLite files and a corpus manifest
(``corpus.toml``, read by ``headwater preprocess --corpus``). Each source
is a random schema drawn from its own seed: two to six tables, the first
an entity table, every other one with a foreign key to one or two earlier
tables (so the graphs are trees, chains and diamonds), a time column on
most tables, numeric, categorical and boolean columns, and on a "text"
source (about one in five) free-text columns of a few to a few dozen
words. Row counts follow a log-normal draw around ``rows`` (a few sources
ten times larger than the median, most near it). ``broken`` of the sources
are deliberately bad, each in its own way: an empty file, a file that is
not SQLite, and a table whose foreign key names a table that does not
exist. The same arguments write the same bytes.

``python -m headwater.data.corpus OUT [--sources N] [--rows R] [--broken K]
[--seed S]`` writes one from the command line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import random
import sqlite3
from pathlib import Path

_WORDS = (
    "river", "stone", "market", "ledger", "harbour", "engine", "orchard", "signal", "lantern",
    "copper", "meadow", "archive", "vessel", "thunder", "garden", "mirror", "compass", "cinder",
    "valley", "needle", "silver", "quarry", "timber", "beacon", "canvas", "falcon", "glacier",
    "hollow", "island", "juniper", "kettle", "lagoon", "marble", "nectar", "obsidian", "pepper",
    "quill", "raven", "saddle", "tundra",
)
_KINDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
_BASE = dt.datetime(2020, 1, 1)
BROKEN_KINDS = ("empty", "not_sqlite", "dangling_foreign_key")


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _table_sql(name: str, parents: list[str], timed: bool, text: bool, rng: random.Random) -> str:
    cols = [f"{name}_id INTEGER PRIMARY KEY"]
    cols += [f"{p}_id INTEGER REFERENCES {p}({p}_id)" for p in parents]
    if timed:
        cols.append("created_at TIMESTAMP")
    cols += ["amount REAL", "kind TEXT", "flag BOOLEAN"]
    if text:
        cols += ["note TEXT"] + (["body TEXT"] if rng.random() < 0.5 else [])
    return f"CREATE TABLE {name} ({', '.join(cols)})"


def _rows(
    name: str, n: int, parent_sizes: list[int], timed: bool, text: bool, body: bool,
    rng: random.Random,
) -> list[tuple[object, ...]]:
    out = []
    for i in range(1, n + 1):
        row: list[object] = [i]
        row += [rng.randint(1, m) for m in parent_sizes]
        if timed:
            row.append((_BASE + dt.timedelta(minutes=rng.randint(0, 60 * 24 * 900))).isoformat(sep=" "))
        row += [round(rng.lognormvariate(3.0, 1.0), 2), rng.choice(_KINDS), rng.random() < 0.3]
        if text:
            row.append(_text(rng, 3, 12))
            if body:
                row.append(_text(rng, 12, 40))
        out.append(tuple(row))
    return out


def write_source(path: Path, seed: int, rows: int) -> None:
    """One SQLite source at ``path`` drawn from ``seed`` (about ``rows`` rows
    in its largest table)."""
    rng = random.Random(seed)
    tables = [f"t{i}" for i in range(rng.randint(2, 6))]
    text = rng.random() < 0.2
    scale = math.exp(rng.gauss(0.0, 0.8))
    sizes: dict[str, int] = {}
    sq = sqlite3.connect(str(path))
    try:
        for k, name in enumerate(tables):
            parents = rng.sample(tables[:k], min(k, rng.choice((1, 1, 2)))) if k else []
            timed = k > 0 or rng.random() < 0.5
            sql = _table_sql(name, parents, timed, text, rng)
            sq.execute(sql)
            n = max(8, int(rows * scale * (0.25 if k == 0 else rng.uniform(0.4, 1.0))))
            sizes[name] = n
            data = _rows(name, n, [sizes[p] for p in parents], timed, text, "body TEXT" in sql, rng)
            sq.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(data[0]))})", data)
        sq.commit()
    finally:
        sq.close()


def _write_broken(path: Path, kind: str) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "not_sqlite":
        path.write_bytes(b"this is not a database\n" * 64)
    else:
        sq = sqlite3.connect(str(path))
        sq.execute("CREATE TABLE orders (orders_id INTEGER PRIMARY KEY, "
                   "shop_id INTEGER REFERENCES shops(shop_id), amount REAL)")
        sq.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(i, i, 1.0) for i in range(1, 20)])
        sq.commit()
        sq.close()


def generate_corpus(
    out: str | Path, sources: int = 100, rows: int = 400, broken: int = 3, seed: int = 0,
    embedder: str = "hash",
) -> Path:
    """Write ``sources`` SQLite sources (``broken`` of them bad, see the
    module doc) under ``out/sources`` and ``out/corpus.toml`` naming them
    (``[defaults] embedder``); the manifest's path."""
    if not 0 <= broken <= sources:
        raise ValueError(f"broken {broken}: between 0 and sources ({sources})")
    root = Path(out)
    (root / "sources").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    bad = set(rng.sample(range(sources), broken))
    entries = []
    for i in range(sources):
        name = f"s{i:04d}"
        path = root / "sources" / f"{name}.sqlite"
        path.unlink(missing_ok=True)
        if i in bad:
            _write_broken(path, BROKEN_KINDS[len([b for b in bad if b < i]) % len(BROKEN_KINDS)])
        else:
            write_source(path, seed * 1_000_003 + i, rows)
        entries.append(f'[[source]]\npath = "sources/{name}.sqlite"\n')
    manifest = root / "corpus.toml"
    manifest.write_text(f'[defaults]\nembedder = "{embedder}"\n\n' + "\n".join(entries),
                        encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headwater.data.corpus", description=__doc__)
    ap.add_argument("out", help="folder to write the sources and corpus.toml into")
    ap.add_argument("--sources", type=int, default=100, help="how many (default: %(default)s)")
    ap.add_argument("--rows", type=int, default=400, help="median rows of a source's largest table")
    ap.add_argument("--broken", type=int, default=3, help="deliberately bad sources")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--embedder", default="hash", help="[defaults] embedder of the manifest")
    a = ap.parse_args(argv)
    path = generate_corpus(a.out, a.sources, a.rows, a.broken, a.seed, a.embedder)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
