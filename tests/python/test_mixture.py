"""Mixtures from Python: the list form and mixture files, open errors that
name the database without leaking the file handles of the ones already
opened, states of another mixture refused, the concatenated tables, the
bounded per-database telemetry (top K, or the listed databases),
`inspect` / `bench` / the trainer's `[[database]]` list on a mixture, and a
mixture of three databases with different schemas (TPC-H, a RelBench
folder, a SQLite library: ``three_schemas.py``)."""

from __future__ import annotations

import gc
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SmallData, Tpch
from three_schemas import LIBRARY_TASKS, write_three_schema_mixture

import headwater
from headwater.mixture import (
    MixtureEntry,
    open_sampler,
    read_mixture,
    reported_task_names,
    sampler_args,
    task_names,
    write_mixture,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
SMALL = {"default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1}


def _held(folder: Path = GOLDEN) -> list[str]:
    """The files under `folder` this process holds, by descriptor or by
    mapping (counting every descriptor instead is flaky: others come and go
    with the garbage collector and the thread pools)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed between the listing and the read
        if target.startswith(str(folder)):
            held.append(target)
    with open("/proc/self/maps") as maps:
        held += [line.split()[-1] for line in maps if f" {folder}/" in line]
    return sorted(held)


def test_a_list_is_a_mixture_with_concatenated_tables_and_metadata() -> None:
    meta1 = json.loads((GOLDEN / "metadata.json").read_text())
    with headwater.Sampler([GOLDEN, GOLDEN], database_weights=[3, 1], **SMALL) as s:
        b = s.next_train_batch()
        meta = s.database_metadata()
        cols = s.column_embeddings()
        cats = s.categorical_embeddings()
        content = s.content_hash
    n_cols = len(meta1["columns"])
    assert cols.shape == (2 * n_cols, meta1["embedder"]["dim"])
    assert cats.shape[0] == 2 * meta1["num_categorical_embeddings"]
    assert [d["name"] for d in meta["databases"]] == ["golden_v1", "golden_v1#2"]
    assert [d["share"] for d in meta["databases"]] == [0.75, 0.25]
    assert meta["databases"][1]["column_offset"] == n_cols
    names = [t["name"] for t in meta1["tasks"]]
    assert [t["name"] for t in meta["tasks"]] == [f"golden_v1/{t}" for t in names] + [
        f"golden_v1#2/{t}" for t in names
    ]
    assert [c["idx"] for c in meta["columns"]] == list(range(2 * n_cols))
    assert content.startswith("mixture-") and b["db_idx"].shape == (1,)
    # One database: the metadata as it was, plus a `databases` list of one.
    with headwater.Sampler(GOLDEN, **SMALL) as one:
        m = one.database_metadata()
        assert one.next_train_batch()["db_idx"][0] == 0
    memory = m.pop("memory")  # the sampler's read plan, beside the metadata
    assert memory["mapped_bytes"] > 0 and memory["random_reads"] is False, memory
    assert m.pop("databases")[0]["share"] == 1.0 and m == meta1


def test_a_missing_database_is_named_and_the_opened_ones_are_closed(tmp_path: Path) -> None:
    # A private copy: no other test's sampler (alive until the garbage
    # collector runs) holds its files.
    mine = tmp_path / "golden"
    shutil.copytree(GOLDEN, mine)
    missing = tmp_path / "nowhere"
    with headwater.Sampler([mine], **SMALL) as s:
        assert _held(mine), "the probe sees an open sampler's files"
        s.next_train_batch()
    del s  # a closed sampler keeps its maps for its metadata until it is dropped
    gc.collect()
    assert _held(mine) == []
    for _ in range(3):
        with pytest.raises(FileNotFoundError, match="database `nowhere`"):
            headwater.Sampler([mine, mine, missing], **SMALL)
    assert _held(mine) == []


def test_a_state_of_another_mixture_is_refused_naming_the_field() -> None:
    with headwater.Sampler(GOLDEN, **SMALL) as s:
        s.next_train_batch()
        single = s.state_dict()
    assert single["version"] == 2 and [d["name"] for d in single["databases"]] == ["golden_v1"]
    with pytest.raises(headwater.StateError, match="sampler state `databases`"):
        headwater.Sampler([GOLDEN, GOLDEN], state=single, **SMALL)
    old = dict(single, version=1)
    with pytest.raises(headwater.StateError, match="sampler state `version`"):
        headwater.Sampler(GOLDEN, state=old, **SMALL)


def test_bad_database_weights_name_the_key() -> None:
    with pytest.raises(headwater.ConfigError, match="database_weights"):
        headwater.Sampler([GOLDEN, GOLDEN], database_weights=[1.0], **SMALL)
    with pytest.raises(headwater.ConfigError, match="unknown database \"nope\""):
        headwater.Sampler([GOLDEN, GOLDEN], database_weights={"nope": 1.0}, **SMALL)
    with pytest.raises(ValueError, match="a database folder or a list"):
        headwater.Sampler(3, **SMALL)  # type: ignore[arg-type]


def test_per_database_telemetry_is_bounded_by_the_top_k(tmp_path: Path) -> None:
    dbs = [GOLDEN] * 5
    with headwater.Sampler(dbs, telemetry_top_databases=2, **SMALL) as s:
        for _ in range(6):
            s.next_train_batch()
        d = s.drain_step_metrics()
        keys = s.telemetry_keys()
    per_db = {k.split("/")[2] for k in keys if k.startswith("sampler/databases/golden")}
    assert per_db == {"golden_v1", "golden_v1#2"}
    assert sum(1 for k in keys if k.startswith("sampler/tasks/")) == 4  # 2 tasks x top 2
    seeds = sum(d[f"sampler/databases/{n}/seeds"] for n in per_db) + d["sampler/databases/other_seeds"]
    assert seeds == 6 * 4
    assert 0 <= d["sampler/databases/steps_since_pick_worst"] < 5


def test_listed_databases_get_their_own_series_and_the_rest_are_folded(tmp_path: Path) -> None:
    """`telemetry_databases` replaces the top K: exactly the listed databases
    report, in the order listed, even the smallest share (which the top 2
    would never pick); the other databases' seeds are folded into
    `other_seeds`."""
    dbs = [GOLDEN] * 4
    listed = ["golden_v1#4", "golden_v1#2"]
    weights = [4.0, 3.0, 2.0, 1.0]
    kw: dict[str, Any] = {"database_weights": weights, "telemetry_top_databases": 2, **SMALL}
    with headwater.Sampler(dbs, telemetry_databases=listed, **kw) as s:
        picked = [int(s.next_train_batch()["db_idx"][0]) for _ in range(60)]
        d = s.drain_step_metrics()
        keys = s.telemetry_keys()
        assert s.config()["telemetry_databases"] == listed
    assert set(picked) == {0, 1, 2, 3}, picked
    seeds = [k.split("/")[2] for k in keys if k.startswith("sampler/databases/golden")]
    assert seeds[: len(listed)] == listed and set(seeds) == set(listed)
    b = SMALL["default_batch_size"]
    assert d["sampler/databases/golden_v1#4/seeds"] == b * picked.count(3)
    assert d["sampler/databases/golden_v1#2/seeds"] == b * picked.count(1)
    assert d["sampler/databases/other_seeds"] == b * (picked.count(0) + picked.count(2))
    tasks = [k.removeprefix("sampler/tasks/") for k in keys if k.startswith("sampler/tasks/")]
    assert {t.split("/")[0] for t in tasks} == set(listed)
    # Without the list, the top 2 by weight report.
    with headwater.Sampler(dbs, **kw) as top:
        top_keys = top.telemetry_keys()
    assert {k.split("/")[2] for k in top_keys if k.startswith("sampler/databases/golden")} == {
        "golden_v1",
        "golden_v1#2",
    }
    # The diagnostics' reading of a mixture file agrees with the sampler.
    mix = write_mixture([MixtureEntry(GOLDEN, w) for w in weights], tmp_path / "mix.toml")
    assert reported_task_names(mix, 2, listed) == tasks


def test_bad_telemetry_databases_name_the_key_and_the_databases() -> None:
    dbs = [GOLDEN] * 3
    names = '["golden_v1", "golden_v1#2", "golden_v1#3"]'
    with pytest.raises(headwater.ConfigError) as e:
        headwater.Sampler(dbs, telemetry_databases=["golden_v1#2", "nope"], **SMALL)
    msg = str(e.value)
    assert "`telemetry_databases`" in msg and 'unknown database "nope"' in msg, msg
    assert names in msg, msg
    with pytest.raises(headwater.ConfigError) as e:
        headwater.Sampler(dbs, telemetry_databases=["golden_v1", "golden_v1"], **SMALL)
    msg = str(e.value)
    assert "`telemetry_databases`" in msg and '"golden_v1" listed twice' in msg, msg
    with pytest.raises(headwater.ConfigError, match="`telemetry_databases`"):
        headwater.Sampler(dbs, telemetry_databases="golden_v1", **SMALL)  # type: ignore[arg-type]


def test_mixture_file_inspect_bench_and_trainer_config(tmp_path: Path) -> None:
    mix = tmp_path / "mix.toml"
    mix.write_text(
        f'[[database]]\npath = "{GOLDEN}"\nweight = 2\n\n'
        f'[[database]]\npath = "{GOLDEN}"\ntasks = ["user_tier"]\n',
        encoding="utf-8",
    )
    entries = read_mixture(mix)
    _, keys = sampler_args(entries)
    assert keys["database_weights"] == [2.0, 1.0]
    assert keys["task_weights"] == {"golden_v1#2/user_tier": 1.0, "golden_v1#2/event_amount_next": 0.0}
    assert task_names(mix)[-1] == "golden_v1#2/event_amount_next"
    with open_sampler(mix, **SMALL) as s:
        picked = {int(s.next_train_batch()["task_idx"][0]) for _ in range(12)}
    assert 3 not in picked  # filtered out
    from headwater.inspection import format_report, inspect

    r = inspect(mix)
    assert [d["name"] for d in r["databases"]] == ["golden_v1", "golden_v1#2"] and r["one_embedder"]
    assert "2 databases" in format_report(r)
    from headwater.bench import run_bench

    b = run_bench(mix, batch_size=4, seq_len=64, threads=[1], steps=3, warmup=2, handoff_samples=2)
    assert b["databases"] == 2 and b["runs"][0]["databases"] == 2
    with pytest.raises(ValueError, match="needs `path`"):
        mix.write_text("[[database]]\nweight = 1\n", encoding="utf-8")
        read_mixture(mix)


def test_a_mistyped_key_or_task_says_which_it_looks_like(tmp_path: Path) -> None:
    mix = tmp_path / "mix.toml"
    mix.write_text(f'[[database]]\npath = "{GOLDEN}"\nwieght = 2\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"\['wieght'\] \(did you mean `weight`\?\)"):
        read_mixture(mix)
    mix.write_text(f'[[databse]]\npath = "{GOLDEN}"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"\['databse'\] \(did you mean `database`\?\)"):
        read_mixture(mix)
    mix.write_text(f'[[database]]\npath = "{GOLDEN}"\ntasks = ["user_tie"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"no task 'user_tie' \(did you mean `user_tier`\?\)"):
        sampler_args(read_mixture(mix))


def test_trainer_config_takes_a_database_list(tmp_path: Path) -> None:
    from headwater.runconfig.config import load_config
    from headwater.train import resolve_database

    cfg_file = tmp_path / "t.toml"
    cfg_file.write_text(
        f'[[database]]\npath = "{GOLDEN}"\n\n[[database]]\npath = ""\nweight = 0.5\n',
        encoding="utf-8",
    )
    cfg = load_config(cfg_file, **{"database.path": str(GOLDEN)})
    assert len(cfg.database.mixture) == 2
    db = resolve_database(cfg)
    assert [e.weight for e in read_mixture(db)] == [1.0, 0.5]
    cfg.check_tasks(db)
    assert task_names(db)[0] == "golden_v1/user_tier"
    with pytest.raises(headwater.ConfigError, match=r"database\.scale_factor"):
        load_config(cfg_file, **{"database.scale_factor": 0.1})


# ----------------------------------------------------------------------------
# Three databases with different schemas
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_schemas(
    tmp_path_factory: pytest.TempPathFactory, tpch: Tpch, small_data: SmallData
) -> Path:
    """TPC-H, the small database in RelBench layout and a SQLite library,
    all hash-embedded: the mixture file."""
    root = tmp_path_factory.mktemp("three")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWATER_CACHE_DIR", str(root / "cache"))
    try:
        return write_three_schema_mixture(root, tpch.built.path, small_data)
    finally:
        mp.undo()


def _in_range(ids: np.ndarray, lo: int, n: int) -> bool:
    return bool(((ids >= lo) & (ids < lo + n)).all())


def test_three_schemas_sample_with_ids_in_each_databases_range(three_schemas: Path) -> None:
    with open_sampler(three_schemas, **SMALL) as s:
        meta = s.database_metadata()
        cols = s.column_embeddings()
        cats = s.categorical_embeddings()
        batches = [s.next_train_batch() for _ in range(30)]
    dbs = meta["databases"]
    own = [d["metadata"] for d in dbs]
    # Three different schemas: table names, and tasks of each kind of source.
    tables = [sorted(t["name"] for t in m["tables"]) for m in own]
    assert tables[1] == ["events", "items", "users"]
    assert tables[2] == ["books", "loans", "members"]
    assert "lineitem" in tables[0] and len({tuple(t) for t in tables}) == 3
    assert [t["name"] for t in own[1]["tasks"]] == ["user_churn"]
    assert [t["name"] for t in own[2]["tasks"]] == LIBRARY_TASKS
    n_cols = [len(m["columns"]) for m in own]
    n_cats = [m["num_categorical_embeddings"] for m in own]
    assert cols.shape[0] == sum(n_cols) == len(meta["columns"])
    assert cats.shape[0] == sum(n_cats)
    assert [d["column_offset"] for d in dbs] == [0, n_cols[0], n_cols[0] + n_cols[1]]
    assert [d["categorical_offset"] for d in dbs] == [0, n_cats[0], n_cats[0] + n_cats[1]]
    assert len({own[i]["embedder"]["name"] for i in range(3)}) == 1
    seen = set()
    for b in batches:
        d = int(b["db_idx"][0])
        seen.add(d)
        live = b["is_padding"] == 0
        assert _in_range(b["column_ids"][live], dbs[d]["column_offset"], n_cols[d]), d
        cat = live & (b["is_null"] == 0) & (b["semantic_types"] == 3)
        ids = b["categorical_embed_ids"][cat]
        assert _in_range(ids, dbs[d]["categorical_offset"], n_cats[d]), d
        task = meta["tasks"][int(b["task_idx"][0])]["name"]
        assert task.split("/")[0] == dbs[d]["name"], (task, d)
    assert seen == {0, 1, 2}


def test_three_schemas_resume_continues_bit_identically(three_schemas: Path) -> None:
    with open_sampler(three_schemas, **SMALL) as s:
        for _ in range(7):
            s.next_train_batch()
        state = s.state_dict()
        want = [s.next_train_batch() for _ in range(12)]
    with open_sampler(three_schemas, state=state, **SMALL) as r:
        got = [r.next_train_batch() for _ in range(12)]
    assert {int(b["db_idx"][0]) for b in want} == {0, 1, 2}
    assert [int(b["fingerprint"][0]) for b in got] == [int(b["fingerprint"][0]) for b in want]
    assert all(np.array_equal(a["column_ids"], b["column_ids"]) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("budget", [3 << 19, 4 << 20])
def test_hot_sets_over_half_the_memory_budget_are_warned_about(
    capfd: pytest.CaptureFixture[str], budget: int
) -> None:
    """A hot set and the next one read ahead must fit the budget together:
    one line names the key, the bytes needed and the largest value that
    fits; a budget that holds both says nothing."""
    paths = [str(GOLDEN), str(GOLDEN)]
    with headwater.Sampler(paths, hot_set_bytes=1 << 20, memory_budget=budget, **SMALL) as s:
        s.next_train_batch()
    err = capfd.readouterr().err
    if budget < 2 << 20:
        assert f"hot_set_bytes = {1 << 20}" in err and f"at most {budget // 2}" in err, err
    else:
        assert "hot_set_bytes" not in err, err
