"""The collective watchdog's judgement, without processes: a fake
key-value store and a fake clock (the real thing, two processes with one
killed or stopped, is ``test_dead_rank.py``).

* a peer whose heartbeat stops is lost after ``peer_timeout_s`` of answered
  reads, not before; one that keeps beating never is; a peer that ended its
  run (``done``) is watched no more;
* a store that stops answering (process 0, which serves it, is gone) names
  rank 0, and the silence of the others does not count meanwhile;
* a peer that wrote ``failed`` is named at once, with its error;
* the way out: the message, ``watchdog-rank<r>.json`` and the exit status,
  naming the last committed checkpoint;
* ``train.peer_timeout_s`` <= 0 or below the floor is a ``ConfigError``
  carrying the key.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from headwater.cluster import watchdog as W
from headwater.errors import ConfigError
from headwater.runconfig.config import load_config
from headwater.rundir import checkpoint as C


class Store:
    """One key-value store shared by the fake ranks; ``up = False``: it does
    not answer (the process serving it is gone)."""

    def __init__(self) -> None:
        self.values: dict[int, str] = {}
        self.up = True

    def channel(self, rank: int) -> Any:
        store = self

        class Channel:
            def put(self, value: str) -> None:
                if not store.up:
                    raise RuntimeError("UNAVAILABLE: Socket closed")
                store.values[rank] = value

            def read(self) -> dict[int, str]:
                if not store.up:
                    raise RuntimeError("UNAVAILABLE: Socket closed")
                return dict(store.values)

        return Channel()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def dogs(world: int, timeout: float = 5.0) -> tuple[Store, Clock, list[W.Watchdog], list[int]]:
    store, clock, exits = Store(), Clock(), []
    out = [
        W.Watchdog(r, world, timeout, store.channel(r), clock=clock, exit=exits.append)
        for r in range(world)
    ]
    return store, clock, out, exits


def tick(clock: Clock, alive: list[W.Watchdog], seconds: float, step: float = 0.5) -> None:
    """``seconds`` pass; every rank in ``alive`` beats every ``step``."""
    for _ in range(round(seconds / step)):
        clock.t += step
        for d in alive:
            d.beat()


def test_a_silent_peer_is_lost_after_the_timeout_and_not_before() -> None:
    _, clock, (a, b, c), _ = dogs(3)
    tick(clock, [a, b, c], 10.0)
    assert a.lost() is None and b.lost() is None and c.lost() is None
    b.step = 7
    tick(clock, [a, b, c], 1.0)
    # b stops; a reads its last beat one tick later: silent for 5.0 s, not > 5 s.
    tick(clock, [a, c], 5.5)
    assert a.lost() is None
    tick(clock, [a, c], 0.5)
    lost = a.lost()
    assert lost is not None and lost.rank == 1 and lost.peer_step == 7, lost
    assert "no new heartbeat for 5.5 s" in lost.how
    c_lost = c.lost()  # c beats after b in a tick: it saw the last beat at once
    assert c_lost is not None and (c_lost.rank, c_lost.peer_step) == (1, 7)


def test_a_peer_that_never_beats_is_lost_too() -> None:
    _, clock, (a, _b), _ = dogs(2)
    tick(clock, [a], 4.5)
    assert a.lost() is None
    tick(clock, [a], 1.0)
    lost = a.lost()
    assert lost is not None and lost.rank == 1 and lost.peer_step is None
    assert "sent no heartbeat for" in lost.how


def test_a_done_peer_is_watched_no_more() -> None:
    _, clock, (a, b), _ = dogs(2)
    tick(clock, [a, b], 2.0)
    b.set_state("done")
    tick(clock, [a], 60.0)
    assert a.lost() is None


def test_a_store_that_stops_answering_names_rank_0() -> None:
    store, clock, (a, b, c), _ = dogs(3)
    tick(clock, [a, b, c], 3.0)
    store.up = False  # process 0 is gone: nobody's beats get through
    tick(clock, [b, c], 4.5)
    # Rank 2 looks as silent as rank 0, but silence counts only while the
    # store answers: nothing is judged yet.
    assert b.lost() is None
    tick(clock, [b, c], 1.0)
    lost = b.lost()
    assert lost is not None and lost.rank == 0, lost
    assert "key-value store, served by process 0, has not answered" in lost.how


def test_a_failed_peer_is_named_at_once() -> None:
    _, clock, (a, b), _ = dogs(2)
    tick(clock, [a, b], 1.0)
    b.step = 3
    b.set_state("failed", "FloatingPointError: loss is nan at step 3")
    a.beat()
    lost = a.lost()
    assert lost is not None and lost.rank == 1 and lost.peer_step == 3
    assert lost.how == "it failed: FloatingPointError: loss is nan at step 3"


def test_a_rank_failing_with_its_own_error_reports_that_not_a_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, clock, (a, b), exits = dogs(2)
    tick(clock, [a, b], 1.0)
    monkeypatch.setattr(W, "_CURRENT", a)
    W.on_error(ValueError("ranks disagree on the telemetry schema / batch shapes"))
    assert a.quiet
    b.set_state("failed", "ValueError: ranks disagree")  # the peer fails the same way
    a.beat()
    lost = a.lost()
    assert lost is not None and lost.rank == 1
    a.fire(lost)
    assert exits == []  # a exits with its own error, by its caller
    b.beat()
    seen_by_b = b.lost()
    assert seen_by_b is not None and seen_by_b.how.startswith("it failed: ValueError: ranks")


def test_fire_reports_the_rank_the_step_and_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "checkpoints" / "4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp").mkdir()  # not committed
    _, clock, (a, _b), exits = dogs(2)
    a.run_dir, a.step = tmp_path, 9
    a.recovery = functools.partial(C.last_committed, tmp_path, 2)
    tick(clock, [a], 6.0)
    lost = a.lost()
    assert lost is not None
    a.fire(lost)
    a.fire(lost)  # once
    assert exits == [W.EXIT_PEER_LOST]
    err = capsys.readouterr().err
    assert "rank 1 lost at step 9" in err and "last committed checkpoint is step 4" in err
    assert f"headwater train --resume {tmp_path} --num-processes 2" in err
    rec = json.loads((tmp_path / "watchdog-rank0.json").read_text())
    assert (rec["lost_rank"], rec["rank"], rec["step"], rec["checkpoint"]) == (1, 0, 9, 4)
    # A cluster launcher's job is resumed with its own flags, on every process.
    step, joined = C.last_committed(tmp_path, 2, True)
    assert step == 4 and joined is not None and "on every process" in joined
    assert C.last_committed(tmp_path / "none", 2, False) == (None, None)


def test_only_collective_failures_on_a_peer_wait_for_the_watchdog() -> None:
    gloo = RuntimeError(
        "UNKNOWN: Gloo all-to-all failed: [pair.cc:538] Read error: Connection reset by peer"
    )
    wrapped = ValueError("sync_global_devices failed")
    wrapped.__cause__ = gloo
    assert W.is_collective_failure(gloo) and W.is_collective_failure(wrapped)
    assert not W.is_collective_failure(FloatingPointError("loss is nan at step 3"))
    assert not W.is_collective_failure(RuntimeError("RESOURCE_EXHAUSTED: out of memory"))


@pytest.mark.parametrize("value", [0, -1, 0.5, 1e9])
def test_a_bad_peer_timeout_is_a_config_error_naming_the_key(value: float) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(None, **{"train.peer_timeout_s": value})
    e = ei.value
    assert e.key == "train.peer_timeout_s" and e.value == json.dumps(value)
    assert "peer_timeout_s must be in 2..=86400 seconds" in str(e)
    assert "--set train.peer_timeout_s=" in str(e)
    with pytest.raises(ConfigError) as ei:
        W.Watchdog(0, 2, value, Store().channel(0))
    assert ei.value.key == "train.peer_timeout_s"


def test_the_default_peer_timeout() -> None:
    assert load_config(None).train.peer_timeout_s == W.DEFAULT_PEER_TIMEOUT_S == 60.0
    assert W.beat_interval(60.0) == 5.0 and W.beat_interval(5.0) == pytest.approx(5 / 6)
