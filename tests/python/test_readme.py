"""Every code block of the README, of every page of the docs site
(``docs/**/*.md``) and of ``dashboards/README.md`` is run or checked.

* Python blocks run against a tiny generated database (the preprocessing
  example on a small DuckDB file, with the schema page's example as its schema
  file; the sampling and telemetry examples on the database it builds, with
  an offline W&B run; the README's quickstart in a scratch directory of its
  own).
* Command lines with concrete arguments (the README's command-line
  quickstart) run for real on a small DuckDB file; the
  ``headwater preprocess`` / ``inspect`` synopses are instantiated with real
  files and run; ``headwater eval`` runs for real on a three-step run of the
  tiny database, whose offline W&B folder the ``wandb sync`` block must name.
* The other command synopses (``train``, ``diag``, ``bench``: minutes each,
  run for real by ``test_train`` / ``test_diag``) are checked option by
  option against the parsers, their ``--set`` keys loaded by the train
  config, and the files they name must exist.
* The SLURM sbatch script cannot run here (no SLURM): its ``srun`` line is
  parsed by ``headwater train``'s parser, carries no job flags, and the
  environment ``srun`` gives each task is resolved to JAX's auto-detection
  (the launch itself is run for real by ``test_cluster``).
* The two set-up commands cannot run inside a test (they install packages):
  the scripts must exist, ``.ci/run`` must call ``scripts/test.sh``, and
  ``scripts/setup.sh`` must install the package that provides the
  ``headwater`` command.
* The mermaid pictures name real commands and API; the Prometheus scrape
  snippet names the targets file the trainer writes; the blocks of the
  generated pages are checked by ``test_docs`` (regenerated and compared).
* ``dashboards/README.md``'s commands run in a scratch directory.

A new block anywhere fails :func:`test_every_block_is_covered` until it is
handled here.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import SmallData, Tpch, _write_duckdb, child_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The README, the contributor guide and every page of the docs site.
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Pages written by ``python -m headwater.docs_gen`` (checked by test_docs).
GENERATED = {
    ROOT / "docs" / "reference" / "metrics.md",
    ROOT / "docs" / "reference" / "config.md",
    ROOT / "docs" / "format.md",
}
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of ``path``."""
    return [(m.group(1), m.group(2)) for m in _FENCE.finditer(path.read_text(encoding="utf-8"))]


def all_blocks() -> list[tuple[Path, str, str]]:
    """``(page, language, text)`` of every block of every page."""
    return [(p, lang, text) for p in PAGES for lang, text in blocks(p)]


def of_kind(name: str) -> list[str]:
    return [t for p, lang, t in all_blocks() if kind(lang, t, p) == name]


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
    "tokens_per_batch=": "python-varlen",
    'headwater.preprocess("my.duckdb", "db/", embedder=': "python-quickstart",
    "headwater.preprocess(": "python-preprocess",
    "headwater.Sampler(": "python-sampler",
    "StepHook(": "python-telemetry",
    "eval_batches(": "python-eval",
    "ranking_metrics(": "python-ranking",
    "forecast_context_svg(": "python-context-picture",
}


#: A word of a command line that stands for something (``SOURCE``,
#: ``[--json]``, ``runs/<name>``): such a line is a synopsis, not a command.
_PLACEHOLDER = re.compile(r"[\[<]|\b[A-Z][A-Z_]+\b")


def _bash_kind(text: str) -> str:
    if text.startswith("#!/bin/bash") and "#SBATCH --array" in text:
        return "sbatch-array"
    if text.startswith("#!/bin/bash") and "#SBATCH" in text:
        return "sbatch"
    lines = command_lines(text)
    if lines and all(re.match(r"(\w+=\$\()?sbatch ", ln) for ln in lines):
        return "sbatch-submit"
    if any("scripts/setup.sh" in ln or "scripts/test.sh" in ln for ln in lines):
        return "setup"
    if lines and all(ln.startswith("wandb ") for ln in lines):
        return "wandb"
    # Concrete command lines run for real, except training and diagnostic runs
    # (minutes each, multi-host: checked as synopses, run by test_train/test_diag).
    if lines and all(
        ln.startswith("headwater ")
        and not ln.startswith(("headwater train", "headwater diag"))
        and not _PLACEHOLDER.search(ln)
        for ln in lines
    ):
        return "cli-run"
    if all(ln.startswith(("headwater ", "cargo bench")) for ln in lines):
        return "synopsis"
    return "unknown"


def _python_kind(text: str) -> str:
    for marker, name in _PYTHON_KINDS.items():
        if marker in text:
            return name
    return "unknown"


def kind(lang: str, text: str, page: Path = README) -> str:
    if page in GENERATED:
        return "generated"
    if lang == "bash":
        return _bash_kind(text)
    if lang == "python":
        return _python_kind(text)
    if lang == "toml" and "label_time_column" in text:
        return "toml-label-task"
    if lang == "toml" and "[[tasks]]" in text and "[tables." in text:
        return "toml-schema"
    if lang == "toml" and "[[database]]" in text:
        return "toml-mixture"
    if lang == "toml" and "[[source]]" in text:
        return "toml-corpus"
    if lang == "yaml" and "file_sd_configs" in text:
        return "prometheus-scrape"
    return {"mermaid": "diagram"}.get(lang, "unknown")


def test_every_block_is_covered() -> None:
    found = [(p, lang, text, kind(lang, text, p)) for p, lang, text in all_blocks()]
    assert not [b for b in found if b[3] == "unknown"], [
        (str(p.relative_to(ROOT)), lang, text) for p, lang, text, k in found if k == "unknown"
    ]
    assert {
        "setup",
        "synopsis",
        "cli-run",
        "python-quickstart",
        "python-preprocess",
        "python-sampler",
        "python-telemetry",
        "python-eval",
        "toml-schema",
        "wandb",
        "diagram",
    } <= {b[3] for b in found}
    # Only the fences above are blocks: no indented fence (in a list or an
    # admonition) escapes the walk.
    for p in PAGES:
        text = p.read_text(encoding="utf-8")
        fences = re.findall(r"^[ \t]*```", text, re.M)
        assert len(fences) == 2 * len(blocks(p)), f"{p}: a fence the test does not see"


def test_readme_is_a_front_door() -> None:
    """At most 250 lines, and every relative link of it leads to a file."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    from markdown.extensions.toc import slugify

    for target, anchor in re.findall(r"\]\(([^)#:]+)(?:#([^)]*))?\)", text):
        assert (ROOT / target).exists(), target
        if anchor:
            page = (ROOT / target).read_text(encoding="utf-8")
            slugs = {slugify(h, "-") for h in re.findall(r"^#+ (.+)$", page, re.M)}
            assert anchor in slugs, (target, anchor)


# ----------------------------------------------------------------------------
# Set-up commands: checked, not run
# ----------------------------------------------------------------------------


def test_setup_commands_exist_and_ci_runs_the_readme_test_command() -> None:
    assert len([t for lang, t in blocks(README) if kind(lang, t) == "setup"]) == 1
    for block in of_kind("setup"):  # the docs repeat them, if at all, verbatim
        cmds = command_lines(block)
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
    return [ln for t in of_kind("synopsis") + of_kind("cli-run") for ln in command_lines(t)]


def _check_set_keys(line: str) -> None:
    """``--set SECTION.KEY=VALUE`` with a real key loads in the train config."""
    from headwater.runconfig.config import load_config, parse_overrides

    words = shlex.split(line)
    sets = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]
    sets = [s for s in sets if not _PLACEHOLDER.search(s)]
    config = words[2] if len(words) > 2 and words[2].endswith(".toml") else None
    if sets:
        load_config(ROOT / config if config else None, **parse_overrides(sets))


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
    if sub == "train":
        _check_set_keys(line)


def test_preprocess_and_inspect_synopses_run(
    tmp_path: Path, make_duckdb: Callable[[Path], Path]
) -> None:
    """``headwater preprocess SOURCE OUT_DIR [--schema schema.toml] [--embedder ...]``,
    ``headwater inspect OUT_DIR [--json]`` and ``headwater verify OUT_DIR
    [--quiet]``, with real files."""
    (block,) = [t for t in of_kind("synopsis") if "headwater preprocess SOURCE" in t]
    source = make_duckdb(tmp_path / "my.duckdb")
    schema = tmp_path / "schema.toml"
    schema.write_text("", encoding="utf-8")
    subst = {
        "SOURCE": str(source),
        "OUT_DIR": str(tmp_path / "db"),
        "schema.toml": str(schema),
        "minilm|hash|auto": "hash",
        "propose|none": "propose",
        "source|locality": "locality",
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
    (text,) = of_kind(name)
    return text


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> Path:
    """The README's preprocessing example, run in a scratch directory on a
    small DuckDB file; the database it writes serves the other examples."""
    work = tmp_path_factory.mktemp("readme")
    _write_duckdb(work / "my.duckdb", small_data)
    # The schema page's example is written for this very database.
    (work / "schema.toml").write_text(_block("toml-schema"), encoding="utf-8")
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


def test_schema_example_declares_what_the_database_holds(tiny_db: Path) -> None:
    """The tiny database was preprocessed with the schema page's example: its
    keys, time columns, types and both tasks (a cell task, a SQL task) are in
    the metadata."""
    import json
    import tomllib

    declared = tomllib.loads(_block("toml-schema"))
    meta = json.loads((tiny_db / "metadata.json").read_text())
    assert [t["name"] for t in meta["tasks"]] == [k["name"] for k in declared["tasks"]]
    assert all(t["num_seeds"] > 0 for t in meta["tasks"])
    tables = {t["name"]: t for t in meta["tables"]}
    for name, decl in declared["tables"].items():
        for key in ("primary_key", "time_column"):
            if key in decl:
                assert json.dumps(tables[name]).count(f'"{decl[key]}"'), (name, key)


def _scratch_with_source(tmp_path: Path, small_data: SmallData) -> Path:
    work = tmp_path / "quickstart"
    work.mkdir()
    _write_duckdb(work / "my.duckdb", small_data)
    return work


def test_python_quickstart_runs(tmp_path: Path, small_data: SmallData) -> None:
    work = _scratch_with_source(tmp_path, small_data)
    ns = _exec_in(work, _block("python-quickstart"), {})
    assert ns["batch"]["is_padding"].shape == (32, 1024)
    assert ns["metrics"]["sampler/batches"] == 1.0


def test_command_line_quickstart_runs(tmp_path: Path, small_data: SmallData) -> None:
    """The README's command lines, as written, in a folder holding ``my.duckdb``."""
    work = _scratch_with_source(tmp_path, small_data)
    for block in of_kind("cli-run"):
        for line in command_lines(block):
            r = subprocess.run(
                [sys.executable, "-m", "headwater.cli", *shlex.split(line)[1:]],
                cwd=work,
                capture_output=True,
                text=True,
                env=child_env(tmp_path),
                timeout=300,
                check=False,
            )
            assert r.returncode == 0, (line, r.stdout[-2000:], r.stderr[-2000:])
    assert (work / "db" / "metadata.json").is_file()


def test_diagrams_name_real_commands_and_api() -> None:
    import headwater
    from headwater.cli import build_parser

    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for text in of_kind("diagram"):
        assert text.startswith("flowchart "), text[:40]
        for sub in re.findall(r"headwater (\w[\w-]*)", text):
            assert sub in action.choices, sub
        for name in re.findall(r"headwater\.(\w+)", text):
            assert hasattr(headwater, name), name
        for method in re.findall(r"(\w+)\(\)", text):
            assert hasattr(headwater.Sampler, method), method


def test_prometheus_scrape_snippet_reads_the_runs_targets_file() -> None:
    import yaml

    from headwater.train.endpoints import FILE_SD

    for text in of_kind("prometheus-scrape"):
        (job,) = yaml.safe_load(text)["scrape_configs"]
        (files,) = [f for sd in job["file_sd_configs"] for f in sd["files"]]
        *dirs, name = files.split("/")
        assert name == FILE_SD  # what the trainer writes into each run
        assert not any(c in d for d in dirs for c in "*?["), files  # Prometheus globs names only


def test_python_sampling_block_runs(tiny_db: Path) -> None:
    ns = _exec_in(tiny_db.parent, _block("python-sampler"), {"db_path": str(tiny_db)})
    assert ns["batch"]["fingerprint"].shape == (1,)
    assert ns["col_emb"].dtype.name == "float16" and ns["meta"]["tasks"]


def test_python_varlen_block_runs(tiny_db: Path) -> None:
    ns = _exec_in(tiny_db.parent, _block("python-varlen"), {"db_path": str(tiny_db)})
    assert len(ns["shapes"]) == 8 and all(b * s == 512 for b, s in ns["shapes"])
    assert len({s for _, s in ns["shapes"]}) > 1, ns["shapes"]


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


def test_the_in_context_training_command_runs(
    tmp_path: Path, tpch: Tpch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The contexts page's one-step recipe, run as written on the TPC-H test
    database (its two query tasks included) for two steps of a small model:
    it trains in context, and all five tasks keep their weight (the query
    tasks declare a label window, so they have examples too)."""
    import json

    from headwater.cli import main

    page = ROOT / "docs" / "contexts.md"
    (line,) = [ln for lang, t in blocks(page) if lang == "bash"
               for ln in command_lines(t) if "recipe" in ln]
    small = ["--set", "model.d_model=32", "--set", "model.num_layers=1", "--set",
             "model.num_heads=2", "--set", "sampler.default_batch_size=4", "--set",
             "sampler.default_sequence_length=128", "--set",
             "train.val_batches=1", "--set", "train.eval_final=false", "--set",
             "logging.prometheus_port=0"]
    rc = main([*shlex.split(line)[1:], "--db", str(tpch.built.path), "--steps", "2", "--dir",
               str(tmp_path / "runs"), "--wandb-mode", "disabled", "--run-name", "rtj", *small])
    out = capfd.readouterr()
    assert rc == 0, out.err[-3000:]
    assert 'gets weight 0 under recipe "rt-j"' not in out.err, out.err[-3000:]
    launch = json.loads((tmp_path / "runs" / "rtj" / "launch.json").read_text())
    assert launch["overrides"]["sampler.recipe"] == "rt-j", launch


def test_context_picture_block_draws_the_committed_picture(
    tpch: Tpch, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/task-kinds.md's block, run as written on a fresh build of the
    default database, draws from a fresh batch exactly the picture the page
    shows (`python -m headwater.context_picture` redraws it after a change
    to the stream)."""
    import headwater.data.default_db as default_db

    (block,) = of_kind("python-context-picture")
    monkeypatch.setattr(default_db, "default_database", lambda **_: tpch.built.path)
    ns: dict[str, Any] = {}
    exec(block, ns)
    committed = (ROOT / "docs" / "img" / "forecast-context.svg").read_text(encoding="utf-8")
    assert ns["svg"] == committed, "the picture changed: python -m headwater.context_picture"
    assert f"{committed.count('<rect')} boxes" in capsys.readouterr().out


def test_label_task_block_is_the_lending_databases_task() -> None:
    """docs/contexts.md's task with a label time is the generated lending
    database's, which ``test_labels`` preprocesses and samples."""
    import tomllib

    from headwater.data.lending import SCHEMA

    (block,) = of_kind("toml-label-task")
    assert tomllib.loads(block)["tasks"][0] in tomllib.loads(SCHEMA)["tasks"]


def test_corpus_manifest_block_reads(tmp_path: Path) -> None:
    """The preprocessing page's corpus manifest, its sources and schema
    created empty: every source, name, weight and option as the page says."""
    from headwater.preprocessing.corpus import read_corpus

    text = _block("toml-corpus")
    for rel in ("sources/shop.duckdb", "sources/library.sqlite", "schemas/shop.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    manifest = tmp_path / "corpus.toml"
    manifest.write_text(text, encoding="utf-8")
    shop, books = read_corpus(manifest)
    assert (shop.name, shop.weight, shop.schema) == ("shop", 2.0, tmp_path / "schemas/shop.toml")
    assert books.name == "books" and books.options == {
        "embedder": "hash", "time_columns": "propose", "memory_limit": "512MiB",
        "row_order": "locality",
    }


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


def test_python_ranking_block_runs(tmp_path: Path) -> None:
    ns = _exec_in(tmp_path, _block("python-ranking"), {})
    assert ns["m"]["map"] == 0.75 and ns["m"]["recall"] == 0.75


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
        'warmup_steps = 0\n[logging]\nprometheus_port = 0\nwandb_mode = "offline"\n',
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
    subst = {
        "RUN_DIR": str(tmp_path / "runs" / "r"),
        "N": "4",
        "val|test|both": "test",
        "STEP": "3",
    }
    words = [subst.get(w, w) for w in shlex.split(line.replace("[", "").replace("]", ""))]
    out = cli(*words[1:])
    assert "baseline" in out.stdout
    assert (tmp_path / "runs" / "r" / "eval-test.json").is_file()
    # The docs' `wandb` lines: real subcommands, and `wandb sync`'s path
    # finds this run's offline W&B folder.
    for block in of_kind("wandb"):
        for line in command_lines(block):
            words = shlex.split(line)
            r = subprocess.run(
                [sys.executable, "-m", "wandb", words[1], "--help"],
                capture_output=True,
                text=True,
                env=child_env(tmp_path),
                timeout=120,
                check=False,
            )
            assert r.returncode == 0, (line, r.stderr[-2000:])
            if words[1] == "sync":
                pattern = words[2].replace("<name>", "r")
                found = list(tmp_path.glob(pattern))
                assert found and all(p.is_dir() for p in found), pattern


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
    from headwater.cluster.job import resolve_job

    (text,) = of_kind("sbatch")
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


def test_the_sbatch_array_builds_the_corpus_shard_by_shard(
    tmp_path: Path, make_sqlite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preprocessing page's job array, each task run as SLURM would run
    it (its array index and count in the environment), then the finishing
    run its submission queues behind the array: every source built once,
    one report per shard, the complete corpus manifest."""
    from headwater.cli import main

    script, submit = _block("sbatch-array"), _block("sbatch-submit")
    directives = dict(
        ln.removeprefix("#SBATCH --").split("=", 1)
        for ln in script.splitlines()
        if ln.startswith("#SBATCH --")
    )
    first, last = map(int, directives["array"].split("-"))
    count = last - first + 1
    (line,) = [ln for ln in script.splitlines() if ln.startswith("headwater ")]
    (wrap,) = re.findall(r'--wrap "([^"]+)"', submit)
    assert "afterok:$jobid" in submit and "--parsable preprocess.sbatch" in submit
    # The corpus where the script expects it: five sources in corpus.toml.
    (tmp_path / "src").mkdir()
    first_db = make_sqlite(tmp_path / "src" / "s0.sqlite")
    names = [f"s{i}" for i in range(5)]
    for name in names[1:]:
        shutil.copy(first_db, tmp_path / "src" / f"{name}.sqlite")
    (tmp_path / "corpus.toml").write_text(
        '[defaults]\nembedder = "hash"\n\n'
        + "\n".join(f'[[source]]\npath = "src/{n}.sqlite"\n' for n in names),
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    for task in range(first, last + 1):
        env = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_COUNT": str(count)}
        argv = shlex.split(re.sub(r"\$(\w+)", lambda m, env=env: env[m[1]], line))
        assert main(argv[1:]) == 0, argv
        assert (tmp_path / "out" / ".corpus" / f"report-{task}-of-{count}.json").is_file()
    built = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir() and p.name[0] != ".")
    assert built == names
    assert main(shlex.split(wrap)[1:]) == 0
    manifest = (tmp_path / "out" / "corpus.toml").read_text(encoding="utf-8")
    assert sorted(re.findall(r'path = "([^"]+)"', manifest)) == names
