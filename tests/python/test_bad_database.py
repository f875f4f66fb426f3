"""A bad database in a mixture (`on_bad_database`): the default fails the
open (or, for a block that fails its checksum mid-run, the batch) naming it;
`skip` drops it with one line naming it and why, shares its weight out,
counts it (`databases/dropped`), lists it in the metadata and the saved
state, and a resume drops it again even once it would open, so the resumed
run delivers what the uninterrupted one would have."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import train_batches

import headwater

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
GOLDEN_V2 = ROOT / "tests" / "data" / "golden_v2"  # format 2: blocks checked on first read
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


@pytest.mark.parametrize("golden", [GOLDEN, GOLDEN_V2])
def test_a_healthy_mixture_drops_nothing(golden: Path) -> None:
    with headwater.Sampler([golden, golden], **SKIP) as s:
        train_batches(s, 12)
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


def _corrupt_copy(tmp_path: Path, name: str) -> Path:
    """A copy of the format-2 golden database whose graph block fails its
    checksum: open reads no payload byte (it succeeds), a batch of it does."""
    bad = tmp_path / name
    shutil.copytree(GOLDEN_V2, bad)
    graph = bad / "graph.bin"
    graph.chmod(0o644)
    b = bytearray(graph.read_bytes())
    (n,) = struct.unpack_from("<I", b, 12)  # the block table's entries
    start = (48 + 16 * n + 63) // 64 * 64  # the first payload byte
    b[(start + len(b)) // 2] ^= 0x10  # one amid block 0's adjacency
    graph.write_bytes(bytes(b))
    return bad


def test_a_block_failing_its_checksum_fails_the_run_by_default(tmp_path: Path) -> None:
    dbs = [GOLDEN_V2, _corrupt_copy(tmp_path, "bad")]
    with headwater.Sampler(dbs, **SMALL) as s, pytest.raises(headwater.FormatError) as e:
        train_batches(s, 16)
    assert "bad/graph.bin" in str(e.value) and "block 0" in str(e.value), e.value


@pytest.mark.parametrize("mixing", ["step", "sequence"])
def test_a_block_failing_its_checksum_mid_run_drops_it_and_a_resume_is_bit_identical(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], mixing: str
) -> None:
    # First: the others keep their ids (it keeps its place in the numbering).
    dbs = [_corrupt_copy(tmp_path, "bad"), GOLDEN_V2]
    capfd.readouterr()
    with headwater.Sampler(dbs, task_mixing=mixing, **SKIP) as s:
        before = train_batches(s, 12)  # `bad` is picked (and found corrupt) among these
        meta = s.database_metadata()
        state = s.state_dict()
        rest = train_batches(s, 4)
        val = s.next_val_batch()
        metrics = s.drain_step_metrics()
        # An evaluation pass leaves its tasks out; asking for one names the drop.
        passed = {int(b["db_idx"][0]) for b in s.eval_batches("val", max_seeds=8)}
        bad_task = next(t["name"] for t in meta["tasks"] if t["name"].startswith("bad/"))
        with pytest.raises(ValueError, match=r"database `bad` was dropped: .*graph\.bin"):
            s.eval_batches("val", task=bad_task)
    err = capfd.readouterr().err
    dropped_lines = [line for line in err.splitlines() if "dropped" in line]
    assert len(dropped_lines) == 1, err
    assert "`bad`" in dropped_lines[0] and "graph.bin" in dropped_lines[0], err
    # It keeps its place (ids stay valid) with share 0; no batch comes from it.
    assert [(d["name"], d["share"]) for d in meta["databases"]] == [
        ("bad", 0.0),
        ("golden_v2", 1.0),
    ]
    assert [d["name"] for d in meta["dropped_databases"]] == ["bad"]
    assert "graph.bin" in meta["dropped_databases"][0]["reason"]
    assert all(set(b["db_idx"].tolist()) == {1} for b in [*before, *rest, val])
    assert passed == {1}
    assert metrics["sampler/databases/dropped"] == 1
    assert state["dropped_databases"] == ["bad"]
    capfd.readouterr()
    with headwater.Sampler(dbs, state=state, task_mixing=mixing, **SKIP) as r:
        dropped = r.database_metadata()["dropped_databases"]
        resumed = train_batches(r, 4)
    assert [d["name"] for d in dropped] == ["bad"] and "mid-run" in dropped[0]["reason"]
    for a, b in zip(rest, resumed, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_last_database_left_is_never_dropped(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    dbs = [_corrupt_copy(tmp_path, "bad"), _corrupt_copy(tmp_path, "worse")]
    capfd.readouterr()
    with (
        headwater.Sampler(dbs, **SKIP) as s,
        pytest.raises(headwater.FormatError, match=r"graph\.bin"),
    ):
        train_batches(s, 16)
    # The first found corrupt is dropped; the other, left alone, fails the run.
    assert sum("dropped" in line for line in capfd.readouterr().err.splitlines()) == 1
