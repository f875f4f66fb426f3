"""The docs site's generated parts are what their sources say.

* The reference pages (every metric, every config key, the on-disk format)
  equal what ``python -m headwater.docs_gen`` writes now: a metric or a
  config key added without regenerating fails here, naming the command.
* Every image a page shows is drawn by ``scripts/plot_benchmarks.py`` from
  the recorded figures, and is committed.
* Every page of ``docs/`` is in ``mkdocs.yml``'s navigation (the strict build
  of ``scripts/test.sh`` also fails on it; this says which page, quickly).

The code blocks of the pages are run or checked by ``test_readme``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_generated_pages_are_fresh() -> None:
    from headwater import docs_gen

    stale = docs_gen.stale(ROOT)
    assert not stale, f"stale generated page(s) {stale}: run `{docs_gen.COMMAND}`"


def test_generated_pages_list_every_metric_and_key() -> None:
    from headwater import _native

    metrics = (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    for row in _native.metric_table():
        assert f"`sampler/{row['key']}`" in metrics, row["key"]
    config = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    for field in _native.sampler_config_schema():
        assert f"| `{field['name']}` |" in config, field["name"]
    for key in ("steps", "eval_every", "wandb_mode", "d_model", "learning_rate"):
        assert f"| `{key}` |" in config, key


def test_the_generator_reads_rows_by_name_and_ignores_extra_fields() -> None:
    """Typed rows (objects with attributes) and rows with more fields give
    the same page as today's dicts."""
    from types import SimpleNamespace

    from headwater import _native, docs_gen

    rows = list(_native.metric_table())
    gauges = list(_native.trainer_gauges())
    page = docs_gen.metrics_page(rows, gauges)
    extra = [{**r, "measured_by": "x"} for r in rows]
    typed = [SimpleNamespace(**r) for r in rows]
    assert docs_gen.metrics_page(extra, gauges) == page
    assert docs_gen.metrics_page(typed, gauges) == page


def _plot_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "plot_benchmarks", ROOT / "scripts" / "plot_benchmarks.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: The pictures drawn from a real batch rather than a benchmark record:
#: docs/contexts.md's (test_the_context_picture_is_drawn_from_a_batch) and
#: docs/task-kinds.md's (test_readme's test_context_picture_block_draws_the_committed_picture).
BATCH_PICTURES = {(DOCS / "img" / n).resolve() for n in ("context.png", "forecast-context.svg", "link-context.svg")}


def test_every_plot_a_page_shows_is_drawn_and_committed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_benchmarks.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    drawn = {p.name for p in tmp_path.glob("*.png")}
    assert drawn == set(_plot_module().FIGURES)
    shown = set()
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page}: {target} is not committed"
            if path in BATCH_PICTURES:
                continue  # drawn from a real batch, each by its own test
            assert path.parent == (DOCS / "benchmarks" / "img").resolve(), (page, target)
            shown.add(path.name)
    assert shown <= drawn, shown - drawn
    assert drawn <= shown, f"drawn but shown on no page: {drawn - shown}"


def test_the_context_picture_is_drawn_from_a_batch(tmp_path: Path, tpch: Any) -> None:
    """``scripts/plot_context.py`` (the picture on the contexts page) draws a real
    in-context sequence: its tiers, read from the sampler's counts, fill the
    sequence but its padding, and every tier has cells."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "context.png"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_context.py"), "--db",
         str(tpch.built.path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    tiers = got["tier_cells"]
    assert sum(tiers) + got["padding"] == 256 and min(tiers) > 0, got
    assert out.stat().st_size > 10_000
    page = (DOCS / "contexts.md").read_text(encoding="utf-8")
    assert "](img/context.png)" in page and "scripts/plot_context.py" in page


def test_every_benchmark_record_says_where_it_comes_from() -> None:
    import json

    for path in sorted((DOCS / "benchmarks" / "data").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        for key in ("study", "date", "machine", "commit", "source"):
            assert record.get(key), (path.name, key)


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    listed = set(re.findall(r"([\w./-]+\.md)", nav))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == listed, (pages - listed, listed - pages)
