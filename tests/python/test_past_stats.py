"""Statistics from the past only, end to end: ``headwater preprocess`` of a
tiny RelBench-layout folder whose rows after the manifest's
``val_timestamp`` carry a planted +1000 shift. With the cutoff the shift is
in no statistic (those of the rows up to the cutoff), and ``headwater
inspect`` names the cutoff; without it (no ``val_timestamp``) the
statistics move."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

START = dt.datetime(2024, 1, 1)
CUTOFF = dt.datetime(2024, 2, 15)
ROWS = 60
SHIFT = 1000.0


def _folder(root: Path, shift: bool, cutoff: bool) -> Path:
    """``events`` (a row a day from ``START``, timed) and ``users`` (no
    time column); ``shift`` adds ``SHIFT`` to every event after ``CUTOFF``."""
    (root / "db").mkdir(parents=True)
    ts = [START + dt.timedelta(days=i) for i in range(ROWS)]
    amount = [
        ((i * 37) % 101) * 0.5 + (SHIFT if shift and t > CUTOFF else 0.0) for i, t in enumerate(ts)
    ]
    events = {
        "event_id": pa.array(range(ROWS), pa.int64()),
        "user_id": pa.array([i % 5 for i in range(ROWS)], pa.int64()),
        "ts": pa.array(ts, pa.timestamp("ns")),
        "amount": pa.array(amount, pa.float64()),
    }
    users = {"user_id": pa.array(range(5), pa.int64()), "score": pa.array([1.0, 2, 3, 4, 50])}
    pq.write_table(pa.table(events), root / "db" / "events.parquet")
    pq.write_table(pa.table(users), root / "db" / "users.parquet")
    val = f"val_timestamp: {CUTOFF.date().isoformat()}\n" if cutoff else ""
    (root / "manifest.yaml").write_text(
        "name: shifted\n" + val + "tables:\n"
        "  users: {pkey: user_id}\n"
        "  events: {pkey: event_id, time_col: ts, fkeys: {user_id: users}}\n",
        encoding="utf-8",
    )
    return root


def _build(tmp: Path, name: str, shift: bool, cutoff: bool, capsys: Any) -> dict[str, Any]:
    """``headwater preprocess`` of the folder; its metadata, by column name."""
    from headwater.cli import main

    src = _folder(tmp / f"{name}_src", shift, cutoff)
    rc = main(["preprocess", str(src), str(tmp / name), "--embedder", "hash"])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads((tmp / name / "metadata.json").read_text(encoding="utf-8"))
    return {"meta": meta, **{c["name"]: c["stats"] for c in meta["columns"]}}


def test_a_shift_after_val_timestamp_is_in_no_statistic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headwater.cli import main

    plain = _build(tmp_path, "plain", shift=False, cutoff=True, capsys=capsys)
    shifted = _build(tmp_path, "shifted", shift=True, cutoff=True, capsys=capsys)
    uncut = _build(tmp_path, "uncut", shift=True, cutoff=False, capsys=capsys)
    keys = ("mean", "std", "min", "max", "stats_count")
    assert [shifted["amount"][k] for k in keys] == [plain["amount"][k] for k in keys]
    assert uncut["amount"]["mean"] - plain["amount"]["mean"] > 100, "today's rule: it moves"
    assert plain["meta"]["timestamp_stats"] == shifted["meta"]["timestamp_stats"]
    # The statistics are the rows' up to the cutoff; counts cover every row.
    amounts = np.array([((i * 37) % 101) * 0.5 for i in range(ROWS)])
    past = amounts[[START + dt.timedelta(days=i) <= CUTOFF for i in range(ROWS)]]
    a = shifted["amount"]
    assert a["mean"] == pytest.approx(past.mean(), rel=1e-12)
    assert a["std"] == pytest.approx(past.std(), rel=1e-9)
    assert (a["count"], a["stats_count"]) == (ROWS, len(past))
    assert "stats_count" not in shifted["score"], "a table without a time column counts whole"
    cutoff_us = (CUTOFF - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    assert shifted["meta"]["stats_rule"]["cutoff_us"] == cutoff_us
    assert "cutoff_us" not in uncut["meta"]["stats_rule"]
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "shifted")]) == 0
    out = capsys.readouterr().out
    assert "statistics    rows dated up to 2024-02-15T00:00:00Z (the validation cutoff)" in out, out


def test_a_database_written_before_the_rule_inspects_as_every_row() -> None:
    from headwater.inspection import format_report, inspect

    golden = Path(__file__).resolve().parents[1] / "data" / "golden_v1"
    r = inspect(golden)
    assert r["statistics"]["cutoff"] is None
    assert "statistics    every row (written before the statistics rule)" in format_report(r)


def test_val_timestamp_reads_as_utc_micros_and_a_bad_one_names_the_manifest() -> None:
    from headwater.errors import SchemaError
    from headwater.preprocessing.sources import _micros

    want = (CUTOFF - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    assert _micros(CUTOFF.date(), "m") == _micros("2024-02-15", "m") == want
    assert _micros("2024-02-15T02:00:00+02:00", "m") == want
    with pytest.raises(SchemaError, match=r"manifest\.yaml: val_timestamp: 'soon'"):
        _micros("soon", "manifest.yaml: val_timestamp")


def test_a_sampler_splitting_otherwise_is_told_which_targets_saw_its_labels(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A query task (hash split): its target's statistics left out the
    default split's val/test seeds, so a sampler with another split seed
    warns, naming the task; one with the default does not."""
    from headwater import _native
    from headwater.cli import main

    src = _folder(tmp_path / "src", shift=False, cutoff=False)
    schema = tmp_path / "schema.toml"
    schema.write_text(
        '[[tasks]]\nname = "amount_x2"\nanchor_table = "events"\ntarget_stype = "numerical"\n'
        'query = "SELECT event_id, NULL, amount * 2 FROM events"\n',
        encoding="utf-8",
    )
    db = tmp_path / "db"
    argv = ["preprocess", str(src), str(db), "--embedder", "hash", "--schema", str(schema)]
    assert main(argv) == 0, capfd.readouterr().err
    capfd.readouterr()
    small = {"default_batch_size": 4, "default_sequence_length": 16}
    for split_seed, warned in ((0, False), (1, True)):
        with _native.Sampler(db, split_seed=split_seed, **small):
            pass
        err = capfd.readouterr().err
        said = "task target(s) amount_x2 left out the val/test seeds of split_seed 0" in err
        assert said == warned, (split_seed, err)
