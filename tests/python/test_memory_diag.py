"""A corpus larger than memory, as ``headwater diag`` shows it, and its
remedy.

``diag_configs/memory/larger_than_memory.toml`` reads six copies of the
session's TPC-H database (one task each) through a page cache that holds
two and a half of them (``debug_page_cache_bytes``): each batch is drawn
from the whole corpus, so most read a database the cache has dropped, and
the run lights exactly the I/O signals it declares (``io_bound``, an empty
queue and the wait, a working set not resident, read amplification), with
the ``io_bound`` reason naming the budget and hot sets.
``larger_than_memory_hot_sets.toml`` is the same corpus, cache and budget
read in hot sets of one database: nothing lights. Both run in one
``headwater diag`` call (one JAX start-up)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import Tpch

import headwater

pytest.importorskip("jax")
pytest.importorskip("wandb")

ROOT = Path(__file__).resolve().parents[2]
LIT = ROOT / "diag_configs" / "memory" / "larger_than_memory.toml"
REMEDY = ROOT / "diag_configs" / "memory" / "larger_than_memory_hot_sets.toml"
TASKS = (
    "order_status",
    "order_num_lineitems",
    "order_priority",
    "customer_repeat_order_90d",
    "part_retail_price",
    "order_status",
)


def corpus(root: Path, db: Path) -> Path:
    """Six copies of ``db``, one task each, and their mixture file."""
    lines = []
    for i, task in enumerate(TASKS):
        # Files derived by other tests (walk graphs) are left behind.
        shutil.copytree(db, root / f"db{i}", ignore=shutil.ignore_patterns("walks"))
        lines += ["[[database]]", f'path = "db{i}"', f'tasks = ["{task}"]', ""]
    mix = root / "mix.toml"
    mix.write_text("\n".join(lines), encoding="utf-8")
    return mix


def test_a_corpus_larger_than_its_page_cache_lights_io_and_hot_sets_quiet_it(
    tmp_path: Path, tpch: Tpch
) -> None:
    from test_diag import lit, run_diag_many

    from headwater import diag as D

    # The cache holds two and a half of the six databases (their format's
    # files, what the sampler maps and counts).
    size = headwater.Database(tpch.built.path).bytes_on_disk
    spec, cfg = D.load_spec(LIT)
    cache = cfg.sampler_kwargs(0)["debug_page_cache_bytes"]
    assert 2 * size < cache < 3 * size, (size, cache)
    mix = corpus(tmp_path, tpch.built.path)
    proc, results = run_diag_many(tmp_path, [LIT, REMEDY], mix)
    over, remedy = results[LIT.stem], results[REMEDY.stem]
    out = f"lit {sorted(lit(over))}, remedy lit {sorted(lit(remedy))}\n{proc.stderr[-2000:]}"
    assert proc.returncode == 0, out
    assert over["ok"] and lit(over) - set(spec.host_dependent) == set(spec.expect), out
    assert set(spec.expect) == {
        "verdict/io_bound",
        "queue/depth_min",
        "queue/wait_seconds",
        "io/working_set_resident",
        "io/read_amplification",
    }
    reason = json.loads((tmp_path / "runs" / LIT.stem / "rank-0.json").read_text())
    assert reason["verdict"] == "io_bound"
    assert "does not fit the memory budget" in reason["verdict_reason"]
    assert "hot_set_bytes" in reason["verdict_reason"], reason["verdict_reason"]
    assert remedy["ok"] and lit(remedy) == set(), out
