"""A bad database in a mixture (`on_bad_database`): the default fails the
open naming it; `skip` drops it with one line naming it and why, shares its
weight out, counts it (`databases/dropped`), lists it in the metadata and
the saved state, and a resume drops it again even once it would open, so
the resumed run delivers what the uninterrupted one would have."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import train_batches

import headwater

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
SMALL = {"default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1}
SKIP = {"on_bad_database": "skip", **SMALL}


def test_a_missing_database_is_dropped_and_its_weight_shared_out(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="database `nowhere`"):
        headwater.Sampler([GOLDEN, missing, GOLDEN], **SMALL)  # the default: error
    capfd.readouterr()
    dbs = [GOLDEN, missing, GOLDEN]
    with headwater.Sampler(dbs, database_weights=[1, 5, 3], **SKIP) as s:
        meta = s.database_metadata()
        picked = {int(s.next_train_batch()["db_idx"][0]) for _ in range(20)}
        metrics = s.drain_step_metrics()
    err = capfd.readouterr().err
    dropped_lines = [line for line in err.splitlines() if "dropped" in line]
    assert len(dropped_lines) == 1 and "`nowhere`" in dropped_lines[0], err
    assert "not a directory" in dropped_lines[0], err
    # The others keep the names they have in the full list, and its weight
    # is shared out: 1 : 3.
    assert [d["name"] for d in meta["databases"]] == ["golden_v1", "golden_v1#2"]
    assert [d["share"] for d in meta["databases"]] == [0.25, 0.75]
    assert [d["name"] for d in meta["dropped_databases"]] == ["nowhere"]
    assert "nowhere" in meta["dropped_databases"][0]["reason"]
    assert all(t["name"].startswith("golden_v1") and "/" in t["name"] for t in meta["tasks"])
    assert picked == {0, 1}
    assert metrics["sampler/databases/dropped"] == 1


def test_a_healthy_mixture_drops_nothing() -> None:
    with headwater.Sampler([GOLDEN, GOLDEN], **SKIP) as s:
        s.next_train_batch()
        meta = s.database_metadata()
        metrics = s.drain_step_metrics()
        state = s.state_dict()
    assert "dropped_databases" not in meta and "dropped_databases" not in state
    assert metrics["sampler/databases/dropped"] == 0


def test_a_corrupt_header_is_dropped_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(GOLDEN, bad)
    graph = bad / "graph.bin"
    graph.write_bytes(b"not a headwater file" + graph.read_bytes()[20:])
    with headwater.Sampler([GOLDEN, bad], **SKIP) as s:
        reason = s.database_metadata()["dropped_databases"][0]["reason"]
    assert "database `bad`" in reason and "graph.bin" in reason, reason
    with pytest.raises(ValueError, match="every database of the mixture was dropped"):
        headwater.Sampler([bad, tmp_path / "nowhere"], **SKIP)


def test_a_resume_drops_it_again_and_continues_bit_identically(tmp_path: Path) -> None:
    flaky = tmp_path / "flaky"  # missing now, present at the resume
    dbs = [GOLDEN, flaky, GOLDEN]
    with headwater.Sampler(dbs, **SKIP) as s:
        train_batches(s, 3)
        state = s.state_dict()
        rest = train_batches(s, 4)
    assert state["dropped_databases"] == ["flaky"]
    shutil.copytree(GOLDEN, flaky)
    with headwater.Sampler(dbs, state=state, **SKIP) as r:
        dropped = r.database_metadata()["dropped_databases"]
        resumed = train_batches(r, 4)
    assert [d["name"] for d in dropped] == ["flaky"]
    assert "state" in dropped[0]["reason"]
    for a, b in zip(rest, resumed, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # A sampler that opened every database refuses the state, naming the field.
    with (
        headwater.Sampler(dbs, **SKIP) as whole,
        pytest.raises(headwater.StateError, match="dropped_databases"),
    ):
        whole.load_state_dict(state)
    # A state that drops a database the mixture does not have is refused.
    with pytest.raises(headwater.StateError, match="dropped_databases"):
        headwater.Sampler([GOLDEN, GOLDEN], state=state, **SKIP)
