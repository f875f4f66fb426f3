"""Resume from Python: ``Sampler.state_dict()`` (as of delivery, JSON-able,
identical on every rank), restoring with ``Sampler(..., state=...)`` and
``load_state_dict()`` (bit-identical continuation, elastic continuation at
another world size), ``skip(n)``, ``replay_batch`` across a resume, and
refusals as ``StateError`` naming the field.

Uses the small DuckDB-built database of ``conftest.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import SmallData, SmallDb, build_small_db

from headwater import _native
from headwater.errors import HeadwaterError, StateError

N: Any = _native
CFG: dict[str, Any] = {
    "default_batch_size": 4,
    "default_sequence_length": 32,
    "max_hops": 2,
    "num_threads": 1,
    "num_prefetch": 3,
    "seed": 11,
}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> SmallDb:
    return build_small_db(tmp_path_factory.mktemp("resume_small"), small_data)


def fps(s: Any, n: int, split: str = "train") -> list[int]:
    nxt = s.next_train_batch if split == "train" else s.next_val_batch
    return [int(nxt()["fingerprint"][0]) for _ in range(n)]


def test_state_dict_is_small_json_as_of_delivery(small: SmallDb) -> None:
    with N.Sampler(small.path, **CFG) as s:
        fps(s, 2)
        deadline = time.monotonic() + 10
        while s.queue_depth() < CFG["num_prefetch"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.queue_depth() == CFG["num_prefetch"], "the producer should run ahead"
        st = s.state_dict()
    assert s.state_dict() == st, "still available after shutdown (e.g. in a SIGTERM handler)"
    assert st["format"] == "headwater-sampler-state" and st["version"] == 2
    assert st["splits"]["train"]["step"] == 2, "prefetched batches are not consumed"
    assert st["splits"]["val"]["step"] == 0
    assert st["content_hash"] == small.built.meta["content_hash"]
    assert len(st["splits"]["train"]["pools"]) == len(st["tasks"])
    text = json.dumps(st)
    assert len(text) < 4096, "O(tasks), not O(seeds)"
    # The same on every rank: nothing rank-specific is in it.
    with (
        N.Sampler(small.path, rank=1, world_size=2, **CFG) as a,
        N.Sampler(small.path, rank=0, world_size=2, **CFG) as b,
    ):
        fps(a, 3)
        fps(b, 3)
        assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize("as_json", [False, True])
def test_restore_continues_bit_identically(small: SmallDb, as_json: bool) -> None:
    with N.Sampler(small.path, **CFG) as s:
        want = fps(s, 9)
        want_val = fps(s, 4, "val")
    with N.Sampler(small.path, **CFG) as s:
        fps(s, 4)
        fps(s, 1, "val")
        st = s.state_dict()
    state: Any = json.dumps(st).encode() if as_json else st
    with N.Sampler(small.path, **{**CFG, "num_threads": 2}, state=state) as r:
        assert fps(r, 5) == want[4:]
        assert fps(r, 3, "val") == want_val[1:]
        keys = r.drain_step_metrics()
        assert keys["sampler/resumes"] == 1.0
    # load_state_dict on a running sampler drops its queue and continues.
    with N.Sampler(small.path, **CFG) as r:
        fps(r, 2)
        r.load_state_dict(st)
        assert fps(r, 5) == want[4:]


def test_elastic_restore_continues_the_global_cursor(small: SmallDb) -> None:
    # Two ranks for 3 steps (one task, so its pool counter moves 2·B a
    # step), then one rank continues the same global cursor.
    cfg = {**CFG, "task_weights": [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]}
    b = CFG["default_batch_size"]
    ranks = [N.Sampler(small.path, rank=r, world_size=2, **cfg) for r in range(2)]
    before = [fps(s, 3) for s in ranks]
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict(), "every rank holds the same state"
    for s in ranks:
        s.shutdown()

    def position(st: dict[str, Any]) -> int:
        p = st["splits"]["train"]["pools"][0]
        return int(p["epoch"] * p["size"] + p["cursor"])

    assert position(state) == 3 * 2 * b
    with N.Sampler(small.path, rank=0, world_size=1, state=state, **cfg) as r:
        assert r.state_dict()["splits"]["train"]["world_sizes"] == [[0, 2], [3, 1]]
        fps(r, 2)
        assert position(r.state_dict()) == 3 * 2 * b + 2 * b
        # Batches delivered before the reshard, by either old rank.
        for rank in (0, 1):
            for step in range(3):
                again = r.replay_batch(step, rank=rank)
                assert int(again["fingerprint"][0]) == before[rank][step]
        with pytest.raises(ValueError, match="`rank`"):
            r.replay_batch(0, rank=2)


def test_skip_is_exact(small: SmallDb) -> None:
    with N.Sampler(small.path, **CFG) as s:
        want = fps(s, 10)
    with N.Sampler(small.path, **CFG) as s:
        assert fps(s, 2) == want[:2]
        s.skip(5)
        assert s.state_dict()["splits"]["train"]["step"] == 7
        assert fps(s, 3) == want[7:]
        with pytest.raises(ValueError, match="`n`"):
            s.skip(-1)
        with pytest.raises(ValueError, match="`split`"):
            s.skip(1, split="test")


def test_refusals_name_the_field(small: SmallDb) -> None:
    with N.Sampler(small.path, **CFG) as s:
        fps(s, 1)
        st = s.state_dict()
    for key, value in [
        ("seed", 12),
        ("split_seed", 3),
        ("split_ratios", (0.7, 0.2, 0.1)),
        ("default_batch_size", 5),
        ("task_pick", "round_robin"),
        ("pool_fraction", 0.5),
        ("task_mixing", "sequence"),
    ]:
        with pytest.raises(StateError, match=f"`{key}`") as e:
            N.Sampler(small.path, **{**CFG, key: value}, state=st)
        assert isinstance(e.value, HeadwaterError)
    newer = {**st, "version": st["version"] + 1}
    with pytest.raises(StateError, match="newer"):
        N.Sampler(small.path, **CFG, state=newer)
    with pytest.raises(StateError, match="`content_hash`"):
        N.Sampler(small.path, **CFG, state={**st, "content_hash": "0" * 16})
    with pytest.raises(StateError, match="`format`"):
        N.Sampler(small.path, **CFG, state={"hello": 1})
    with pytest.raises(StateError, match="JSON"):
        N.Sampler(small.path, **CFG, state="{not json")
    # Harmless differences are accepted.
    with N.Sampler(
        small.path, **{**CFG, "num_prefetch": 1, "num_threads": 2, "telemetry": False}, state=st
    ) as r:
        assert r.state_dict()["splits"]["train"]["step"] == 1
    with N.Sampler(small.path, **CFG) as r, pytest.raises(StateError, match="`seed`"):
        r.load_state_dict({**st, "config": {**st["config"], "seed": 99}})


def test_every_failed_restore_is_a_state_error(small: SmallDb) -> None:
    """Random bytes, a non-JSON object, a JSON scalar: ``StateError``
    naming `state`, never ``ValueError``/``TypeError``; the sampler still
    works after each. ``check_state_dict`` refuses the same and restores
    nothing."""
    import os

    with N.Sampler(small.path, **CFG) as s:
        first = fps(s, 2)
        st = s.state_dict()
        for bad in (os.urandom(64), b"\xff\xfe", object(), 7, "[1, 2]"):
            with pytest.raises(StateError) as e:
                s.load_state_dict(bad)
            assert type(e.value) is StateError and e.value.field in ("state", "format")
            with pytest.raises(StateError):
                s.check_state_dict(bad)
        with pytest.raises(StateError, match="`content_hash`"):
            s.check_state_dict({**st, "content_hash": "0" * 16})
        s.check_state_dict(st)  # fits: nothing restored, the stream goes on
        assert s.state_dict()["splits"]["train"]["step"] == 2
        later = fps(s, 1)
    with N.Sampler(small.path, **CFG) as r:
        assert fps(r, 3) == first + later


def test_errors_print_as_headwater_errors() -> None:
    """One spelling: every exception class is ``headwater.errors.X``, the
    same object as ``headwater.X`` and ``headwater._native.X``, and pickles."""
    import pickle

    import headwater
    from headwater import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert f"{cls.__module__}.{cls.__qualname__}" == f"headwater.errors.{name}"
        assert repr(cls) == f"<class 'headwater.errors.{name}'>"
        assert getattr(headwater, name) is cls and getattr(N, name) is cls
        assert type(pickle.loads(pickle.dumps(cls("x")))) is cls


def test_a_format_version_error_names_its_database(small: SmallDb, tmp_path: Any) -> None:
    import shutil

    from headwater.errors import FormatError

    db = tmp_path / "clinic"
    shutil.copytree(small.path, db)
    meta = db / "metadata.json"
    meta.chmod(0o644)
    m = json.loads(meta.read_text())
    m["format_version"] = 99
    meta.write_text(json.dumps(m))
    with pytest.raises(FormatError) as e:
        N.Sampler(db, **CFG)
    assert "database `clinic`: format version 99 is not supported" in str(e.value), e.value
