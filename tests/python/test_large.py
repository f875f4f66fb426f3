"""Large-database safety from Python: ``headwater verify``, ``verify="full"``,
``sampler/startup_seconds``, and nothing lost on bad input (strict CSV,
empty database files, ``inspect`` on a directory that is not a database)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater import _native
from headwater.errors import SchemaError
from headwater.preprocessing.sources import open_source

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater.cli", *args],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def corrupt_copy(tmp_path: Path) -> Path:
    """The golden database with one payload byte of ``tables/2.bin`` flipped."""
    db = tmp_path / "db"
    shutil.copytree(GOLDEN, db)
    p = db / "tables" / "2.bin"
    b = bytearray(p.read_bytes())
    b[-40] ^= 0x20
    p.write_bytes(bytes(b))
    return db


def test_verify_passes_a_good_database_and_names_a_corrupt_file(corrupt_copy: Path) -> None:
    good = cli("verify", str(GOLDEN))
    assert good.returncode == 0, good.stderr
    assert "verified 9 files" in good.stdout and ": ok" in good.stdout
    bad = cli("verify", "--quiet", str(corrupt_copy))
    assert bad.returncode == 1
    assert "tables/2.bin" in bad.stderr and "payload checksum mismatch" in bad.stderr
    assert "1 problem(s)" in bad.stdout


def test_plain_open_skips_payloads_and_verify_full_checks_them(corrupt_copy: Path) -> None:
    headwater.Database(corrupt_copy)  # O(metadata): the flipped payload byte is not read
    with headwater.Sampler(corrupt_copy, default_batch_size=4, telemetry=False) as s:
        s.next_train_batch()  # wrong-but-safe data, no crash
    with pytest.raises(headwater.FormatError, match=r"tables/2\.bin.*payload checksum"):
        headwater.Sampler(corrupt_copy, verify="full")


def test_startup_seconds_is_drained() -> None:
    with headwater.Sampler(GOLDEN, default_batch_size=4) as s:
        s.next_train_batch()
        m = s.drain_step_metrics()
    v = m[f"{_native.TELEMETRY_PREFIX}startup_seconds"]
    assert 0.0 < v < 60.0, v


def test_inspect_of_a_directory_that_is_not_a_database_says_so(tmp_path: Path) -> None:
    r = cli("inspect", str(tmp_path))
    assert r.returncode == 2
    assert "is not a headwater database" in r.stderr and "No such file" not in r.stderr


@pytest.mark.parametrize("suffix", [".sqlite", ".duckdb"])
def test_empty_database_file_says_it_is_empty(tmp_path: Path, suffix: str) -> None:
    p = tmp_path / f"empty{suffix}"
    p.write_bytes(b"")
    with pytest.raises(SchemaError, match="the file is empty"):
        open_source(p)


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        # An unterminated quote swallows the rest; extra fields after it.
        ('id,name,value\n1,"abc,2\n2,x,3,4,5\n', 2, "unterminated quote"),
        # Ragged rows.
        ("id,name,value\n1,a,2\n3,b\n4,c,5,6\n", 3, "2 fields, the header has 3"),
        ("id,name,value\n1,a,2\n4,c,5,6\n", 3, "4 fields, the header has 3"),
    ],
)
def test_bad_csv_fails_with_file_and_line(tmp_path: Path, text: str, line: int, what: str) -> None:
    d = tmp_path / "src"
    d.mkdir()
    (d / "things.csv").write_text(text, encoding="utf-8")
    r = cli("preprocess", str(d), str(tmp_path / "out"), "--embedder", "hash")
    assert r.returncode == 2, r.stdout
    assert f"things.csv, line {line}" in r.stderr and what in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_good_csv_reads_every_row(tmp_path: Path) -> None:
    d = tmp_path / "src"
    d.mkdir()
    rows = "".join(f'{i},"name, {i}",{i * 1.5}\n' for i in range(50))
    (d / "things.csv").write_text("id,name,value\n" + rows, encoding="utf-8")
    src = open_source(d)
    (n,) = src.con.execute('SELECT count(*) FROM "things"').fetchone()
    assert n == 50
    assert [c for c, _ in src.tables["things"].columns] == ["id", "name", "value"]


def _library_sqlite(path: Path) -> Path:
    """A new user's SQLite file: no schema, timestamps under ordinary names."""
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE members (member_id INTEGER PRIMARY KEY, email TEXT, name TEXT);
        CREATE TABLE loans (loan_id INTEGER PRIMARY KEY, member_id INTEGER REFERENCES
            members(member_id), loaned_at TIMESTAMP NOT NULL, returned DATE);
        CREATE TABLE reviews (review_id INTEGER PRIMARY KEY, member_id INTEGER REFERENCES
            members(member_id), written_at TIMESTAMP, updated_at TIMESTAMP, stars INTEGER);
        """
    )
    for i in range(59):
        con.execute(
            "INSERT INTO members VALUES (?, ?, ?)", (i, f"user{i}@example.org", f"Reader Number {i}")
        )
    for i in range(300):
        day = f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}"
        con.execute(
            "INSERT INTO loans VALUES (?, ?, ?, ?)",
            (i, i % 59, f"{day} 10:00:00", None if i % 3 else day),
        )
        con.execute(
            "INSERT INTO reviews VALUES (?, ?, ?, ?, ?)",
            (i, i % 59, f"{day} 11:00:00", f"{day} 12:00:00", i % 5),
        )
    con.commit()
    con.close()
    return path


def _meta(db: Path) -> dict[str, Any]:
    return json.loads(headwater.Database(db).metadata_json())


def test_sql_source_gets_time_columns_proposed_and_a_warning_where_none_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _library_sqlite(tmp_path / "library.sqlite")
    headwater.preprocess(src, tmp_path / "out", embedder="hash", progress=True)
    err = capsys.readouterr().err
    assert '[tables.loans] time_column = "loaned_at"' in err, err
    assert "WARNING: table `reviews` has timestamp columns written_at, updated_at" in err, err
    meta = _meta(tmp_path / "out")
    times = {t["name"]: t["time_column"] for t in meta["tables"]}
    assert times == {"loans": "loaned_at", "members": None, "reviews": None}
    # All-distinct strings of a 59-row table are not categorical tasks.
    members = next(t for t in meta["tables"] if t["name"] == "members")
    stypes = {c["name"]: c["stype"] for c in meta["columns"] if c["table"] == members["idx"]}
    stypes.update({u["name"]: u["stype"] for u in members["unstored_columns"]})
    assert stypes["email"] == "identifier" and stypes["name"] == "text", stypes
    assert not [k for k in meta["tasks"] if k["name"].startswith("members.")], meta["tasks"]

    headwater.preprocess(src, tmp_path / "none", embedder="hash", time_columns="none")
    times = {t["name"]: t["time_column"] for t in _meta(tmp_path / "none")["tables"]}
    assert set(times.values()) == {None}
