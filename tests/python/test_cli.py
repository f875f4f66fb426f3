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
