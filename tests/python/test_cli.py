"""The ``headwater`` command line as a new user meets it: plain help text,
help on every option of every command, ``--version``."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env

import headwater
from headwater.cli import build_parser
from headwater.diag.run import _parser as diag_parser

_MARKUP = re.compile(r"``|:(func|class|mod|data|meth):`")


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_top_level_help_is_plain_text() -> None:
    text = build_parser().format_help()
    assert not _MARKUP.search(text), text
    for name in ("preprocess", "inspect", "default-db", "bench", "train", "eval", "diag"):
        assert name in text


@pytest.mark.parametrize("command", [*_subparsers(build_parser()), "diag (own parser)"])
def test_every_option_has_help(command: str) -> None:
    if command == "diag (own parser)":
        parser = diag_parser()
    else:
        parser = _subparsers(build_parser())[command]
    assert not _MARKUP.search(parser.format_help())
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        assert a.help and a.help.strip(), f"headwater {command}: {a.option_strings or a.dest}"


def test_version(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "headwater.cli", "--version"],
        capture_output=True,
        text=True,
        env=child_env(tmp_path),
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and r.stdout.strip() == f"headwater {headwater.__version__}"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from headwater.cli import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("command", ["inspect", "verify", "bench"])
def test_a_missing_database_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``headwater verify /nope/db``: the error says the path does not exist
    (not "not a directory") and no progress bar is drawn before it."""
    nope = tmp_path / "nope" / "db"
    rc, out, err = _cli(capsys, command, str(nope))
    assert rc == 2 and out == "", out
    assert err.strip() == (
        f"headwater {command}: error: {nope} does not exist (expected a headwater database "
        "directory or a mixture file)"
    ), err
    assert "not a directory" not in err and "%|" not in err


def test_the_overwrite_hint_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, _, err = _cli(capsys, "preprocess", str(tmp_path), str(out_dir), "--embedder", "hash")
    assert rc == 2 and "--overwrite" in err and "overwrite=True" not in err, err


def _csv_folder(root: Path) -> Path:
    root.mkdir()
    (root / "patients.csv").write_text("patient_id,age\n1,30\n2,41\n3,55\n", encoding="utf-8")
    (root / "visits.csv").write_text(
        "visit_id,patient_id,cost\n10,1,5.5\n11,1,7.0\n12,2,3.25\n13,3,9.0\n", encoding="utf-8"
    )
    return root


def test_a_source_without_foreign_keys_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CSV folder without a schema has no foreign keys (0 edges): a
    warning says so and how to declare them; with the keys declared, none."""
    src = _csv_folder(tmp_path / "clinic")
    common = ("--embedder", "hash", "--time-columns", "none")
    rc, _, err = _cli(capsys, "preprocess", str(src), str(tmp_path / "db"), *common)
    assert rc == 0, err
    assert "2 tables and no foreign keys, so 0 foreign-key edges" in err, err
    assert "foreign_keys = {column" in err and "--schema" in err
    assert headwater.inspect(tmp_path / "db")["edges"] == 0
    schema = tmp_path / "schema.toml"
    schema.write_text(
        '[tables.patients]\nprimary_key = "patient_id"\n'
        '[tables.visits]\nprimary_key = "visit_id"\nforeign_keys = { patient_id = "patients" }\n',
        encoding="utf-8",
    )
    rc, _, err = _cli(
        capsys, "preprocess", str(src), str(tmp_path / "db2"), "--schema", str(schema), *common
    )
    assert rc == 0, err
    assert "foreign-key edges" not in err, err
    assert headwater.inspect(tmp_path / "db2")["edges"] > 0
    # The bar that a missing path must not draw is there for a real database.
    rc, out, err = _cli(capsys, "verify", str(tmp_path / "db2"))
    assert rc == 0 and out.endswith(": ok\n") and "verify: 100%|" in err, (out, err)
