"""Every code block of the README (and of ``dashboards/README.md``) is run or
checked.

* Python blocks run against a tiny generated database (the preprocessing
  example on a small DuckDB file, the sampling and telemetry examples on the
  database it builds, with an offline W&B run).
* ``headwater preprocess`` / ``inspect`` synopses are instantiated with those
  files and run through the real command line.
* ``headwater eval`` runs for real on a three-step run of that database.
* The other command synopses (``train``, ``diag``, ``bench``: minutes each,
  run for real by ``test_train`` / ``test_diag``) are checked option by
  option against the parsers, and the files they name must exist.
* The SLURM sbatch script cannot run here (no SLURM): its ``srun`` line is
  parsed by ``headwater train``'s parser, carries no job flags, and the
  environment ``srun`` gives each task is resolved to JAX's auto-detection
  (the launch itself is run for real by ``test_cluster``).
* The two set-up commands cannot run inside a test (they install packages):
  the scripts must exist, ``.ci/run`` must call ``scripts/test.sh``, and
  ``scripts/setup.sh`` must install the package that provides the
  ``headwater`` command.
* ``dashboards/README.md``'s commands run in a scratch directory.

A new block in a README fails :func:`test_every_block_is_covered` until it is
handled here.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import SmallData, _write_duckdb, child_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of ``path``."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(path.read_text(encoding="utf-8"))]


def command_lines(text: str) -> list[str]:
    """The commands of a bash block, comments dropped; an indented line
    continues the synopsis above it."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if raw[:1].isspace() and out:
            out[-1] += " " + line
        else:
            out.append(line)
    return out


_PYTHON_KINDS = {
    "headwater.preprocess(": "python-preprocess",
    "headwater.Sampler(": "python-sampler",
    "StepHook(": "python-telemetry",
    "eval_batches(": "python-eval",
}


def kind(lang: str, text: str) -> str:
    if lang == "python":
        for marker, name in _PYTHON_KINDS.items():
            if marker in text:
                return name
    if lang == "toml" and "[[database]]" in text:
        return "toml-mixture"
    if lang == "bash" and text.startswith("#!/bin/bash") and "#SBATCH" in text:
        return "sbatch"
    if lang == "bash":
        lines = command_lines(text)
        if any("scripts/setup.sh" in ln or "scripts/test.sh" in ln for ln in lines):
            return "setup"
        if all(ln.startswith(("headwater ", "cargo bench")) for ln in lines):
            return "synopsis"
    return "unknown"


def test_every_block_is_covered() -> None:
    kinds = [kind(lang, text) for lang, text in blocks(README)]
    assert "unknown" not in kinds, [
        b for b, k in zip(blocks(README), kinds, strict=True) if k == "unknown"
    ]
    assert {
        "setup",
        "synopsis",
        "python-preprocess",
        "python-sampler",
        "python-telemetry",
        "python-eval",
    } <= set(kinds)


# ----------------------------------------------------------------------------
# Set-up commands: checked, not run
# ----------------------------------------------------------------------------


def test_setup_commands_exist_and_ci_runs_the_readme_test_command() -> None:
    (setup,) = [t for lang, t in blocks(README) if kind(lang, t) == "setup"]
    cmds = command_lines(setup)
    assert cmds == ["bash scripts/setup.sh && headwater train", "bash scripts/test.sh"]
    assert (ROOT / "scripts" / "setup.sh").is_file() and (ROOT / "scripts" / "test.sh").is_file()
    assert "bash scripts/test.sh" in command_lines((ROOT / ".ci" / "run").read_text())
    assert re.search(
        r'^headwater = "headwater\.cli:main"$', (ROOT / "pyproject.toml").read_text(), re.M
    )
    setup_sh = (ROOT / "scripts" / "setup.sh").read_text()
    assert '".[train]"' in setup_sh and '".[test]"' in setup_sh  # installs this package
    # `headwater train` with no argument is a valid command line.
    from headwater.cli import build_parser

    assert build_parser().parse_args(["train"]).config is None


# ----------------------------------------------------------------------------
# Command synopses
# ----------------------------------------------------------------------------


def _parser_for(sub: str) -> argparse.ArgumentParser:
    from headwater.cli import build_parser
    from headwater.diag.run import _parser as diag_parser

    if sub == "diag":
        return diag_parser()
    top = build_parser()
    (action,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices[sub]


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def synopsis_lines() -> list[str]:
    return [
        ln for lang, t in blocks(README) if kind(lang, t) == "synopsis" for ln in command_lines(t)
    ]


@pytest.mark.parametrize("line", synopsis_lines())
def test_synopsis_options_exist(line: str) -> None:
    if line.startswith("cargo bench"):
        name = line.split("--bench", 1)[1].split()[0]
        cargo = (ROOT / "Cargo.toml").read_text()
        assert re.search(rf'\[\[bench\]\]\s*\nname = "{name}"', cargo), name
        assert (ROOT / "benches" / f"{name}.rs").is_file()
        return
    words = line.replace("[", " ").replace("]", " ").split()
    sub = words[1]
    known = _options(_parser_for(sub))
    for w in words[2:]:
        if w.startswith("--"):
            assert w.split("=")[0] in known, (line, w)
        elif "/" in w and w.endswith(".toml"):
            assert (ROOT / w).is_file(), w


def test_preprocess_and_inspect_synopses_run(
    tmp_path: Path, make_duckdb: Callable[[Path], Path]
) -> None:
    """``headwater preprocess SOURCE OUT_DIR [--schema schema.toml] [--embedder ...]``,
    ``headwater inspect OUT_DIR [--json]`` and ``headwater verify OUT_DIR
    [--quiet]``, with real files."""
    (block,) = [t for lang, t in blocks(README) if lang == "bash" and "headwater preprocess" in t]
    source = make_duckdb(tmp_path / "my.duckdb")
    schema = tmp_path / "schema.toml"
    schema.write_text("", encoding="utf-8")
    subst = {
        "SOURCE": str(source),
        "OUT_DIR": str(tmp_path / "db"),
        "schema.toml": str(schema),
        "minilm|hash|auto": "hash",
        "propose|none": "propose",
    }
    for line in command_lines(block):
        words = [subst.get(w, w) for w in shlex.split(line.replace("[", "").replace("]", ""))]
        r = subprocess.run(
            [sys.executable, "-m", "headwater.cli", *words[1:]],
            capture_output=True,
            text=True,
            env=child_env(tmp_path),
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, (words, r.stdout[-2000:], r.stderr[-2000:])
    assert (tmp_path / "db" / "metadata.json").is_file()


# ----------------------------------------------------------------------------
# Python blocks
# ----------------------------------------------------------------------------


def _block(name: str) -> str:
    (text,) = [t for lang, t in blocks(README) if kind(lang, t) == name]
    return text


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Path:
    """The README's preprocessing example, run in a scratch directory on a
    small DuckDB file; the database it writes serves the other examples."""
    work = tmp_path_factory.mktemp("readme")
    _write_duckdb(work / "my.duckdb", small_data)
    (work / "schema.toml").write_text("", encoding="utf-8")
    _exec_in(work, _block("python-preprocess"), {})
    assert (work / "db" / "metadata.json").is_file()
    return work / "db"


def _exec_in(cwd: Path, code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    import os

    old = Path.cwd()
    os.chdir(cwd)
    try:
        exec(compile(code, str(README), "exec"), namespace)
    finally:
        os.chdir(old)
    return namespace


def test_python_sampling_block_runs(tiny_db: Path) -> None:
    ns = _exec_in(tiny_db.parent, _block("python-sampler"), {"db_path": str(tiny_db)})
    assert ns["batch"]["fingerprint"].shape == (1,)
    assert ns["col_emb"].dtype.name == "float16" and ns["meta"]["tasks"]


def test_mixture_file_block_opens_and_samples(tiny_db: Path, tmp_path: Path) -> None:
    """The README's mixture file, its two databases linked to the tiny one and
    its task filter naming one of the tiny database's tasks."""
    import json

    from headwater.mixture import open_sampler

    task = json.loads((tiny_db / "metadata.json").read_text())["tasks"][0]["name"]
    (tmp_path / "dbs").mkdir()
    for name in ("tpch", "stack"):
        (tmp_path / "dbs" / name).symlink_to(tiny_db, target_is_directory=True)
    mix = tmp_path / "mix.toml"
    mix.write_text(_block("toml-mixture").replace("order_status", task), encoding="utf-8")
    with open_sampler(mix, default_batch_size=4, default_sequence_length=64) as s:
        b = s.next_train_batch()
        meta = s.database_metadata()
    assert [d["name"] for d in meta["databases"]] == ["tpch", "stack"]
    assert [d["share"] for d in meta["databases"]] == [2 / 3, 1 / 3]
    assert int(b["db_idx"][0]) in (0, 1)


def test_python_telemetry_block_runs(tiny_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("jax")
    wandb = pytest.importorskip("wandb")
    import headwater

    run = wandb.init(mode="offline", dir=str(tmp_path), project="readme")
    try:
        with headwater.Sampler(str(tiny_db), default_batch_size=4, default_sequence_length=64) as s:
            ns = _exec_in(
                tmp_path, _block("python-telemetry"), {"sampler": s, "run": run, "steps": 3}
            )
    finally:
        run.finish()
    assert ns["reduced"]["sampler/batches"] == 1.0


def test_python_eval_block_runs(tiny_db: Path, tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    import headwater

    with headwater.Sampler(str(tiny_db), default_batch_size=4, default_sequence_length=64) as s:
        ns = _exec_in(tmp_path, _block("python-eval"), {"sampler": s})
        want = {i: t["seeds"] for i, t in enumerate(s.eval_batches("val").tasks()) if t["seeds"]}
    assert ns["seen"] == want


def test_eval_synopsis_runs_on_a_saved_run(tiny_db: Path, tmp_path: Path) -> None:
    """``headwater eval RUN_DIR [--split val|test|both] [--step STEP] [--max-seeds N]``
    for real, on the final checkpoint of a three-step run of the tiny database."""
    pytest.importorskip("jax")
    (line,) = [ln for ln in synopsis_lines() if ln.startswith("headwater eval")]
    cfg = tmp_path / "t.toml"
    cfg.write_text(
        f'[database]\npath = "{tiny_db}"\n[sampler]\ndefault_batch_size = 4\n'
        "default_sequence_length = 32\nnum_threads = 1\n[model]\nd_model = 16\n"
        "num_layers = 1\nnum_heads = 2\n[train]\nsteps = 3\nval_batches = 0\n"
        "warmup_steps = 0\n[logging]\nprometheus_port = 0\nwandb_mode = \"disabled\"\n",
        encoding="utf-8",
    )

    def cli(*words: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "headwater.cli", *words],
            capture_output=True,
            text=True,
            env=child_env(tmp_path),
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, (words, r.stdout[-2000:], r.stderr[-2000:])
        return r

    cli("train", str(cfg), "--dir", str(tmp_path / "runs"), "--run-name", "r")
    # The run's last checkpoint is step 3 (steps = 3).
    subst = {"RUN_DIR": str(tmp_path / "runs" / "r"), "N": "4", "val|test|both": "test", "STEP": "3"}
    words = [subst.get(w, w) for w in shlex.split(line.replace("[", "").replace("]", ""))]
    out = cli(*words[1:])
    assert "baseline" in out.stdout
    assert (tmp_path / "runs" / "r" / "eval-test.json").is_file()


# ----------------------------------------------------------------------------
# dashboards/README.md
# ----------------------------------------------------------------------------


def test_dashboards_readme_commands_run(tmp_path: Path) -> None:
    pytest.importorskip("grafana_foundation_sdk")
    ((lang, text),) = blocks(ROOT / "dashboards" / "README.md")
    assert lang == "bash"
    for line in command_lines(text):
        words = shlex.split(line)
        assert words[:2] == ["python", "-m"], line
        if words[2] == "pytest":
            continue  # this very suite runs that file
        r = subprocess.run(
            [sys.executable, *words[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=child_env(tmp_path),
            timeout=120,
            check=False,
        )
        assert r.returncode == 0, (line, r.stdout, r.stderr)
    written = tmp_path / "dashboards" / "headwater.json"
    assert written.read_text() == (ROOT / "dashboards" / "headwater.json").read_text()


def test_sbatch_example_leaves_the_job_to_slurm() -> None:
    from headwater.cli import build_parser
    from headwater.train.cluster import resolve_job

    (text,) = [t for lang, t in blocks(README) if kind(lang, t) == "sbatch"]
    directives = dict(
        ln.removeprefix("#SBATCH --").split("=", 1)
        for ln in text.splitlines()
        if ln.startswith("#SBATCH --")
    )
    assert int(directives["nodes"]) > 1 and directives["ntasks-per-node"] == "1"
    (srun,) = [ln for ln in text.splitlines() if ln.startswith("srun ")]
    args = build_parser().parse_args(shlex.split(srun)[2:])
    assert (args.coordinator, args.num_processes, args.process_id) == (None, None, None)
    assert (ROOT / args.config).is_file()
    # What srun sets for each task (2 nodes x 1 task): JAX reads the rest.
    env = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": directives["nodes"], "SLURM_PROCID": "1"}
    job = resolve_job(env=env)
    assert (job.mode, job.launcher) == ("auto", "SLURM")
    assert resolve_job(env={"SLURM_JOB_ID": "42", "SLURM_NTASKS": "1"}).mode == "single"
