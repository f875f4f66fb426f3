"""`stage_dir`: each database is copied to node-local disk once per host
(under a lock, verified by every checksum, marked `.staged`) and read from
there, with the same batches; a corrupt copy is never used; a stage folder
without room is a clear error naming the key and the bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import train_batches

import headwater

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
SMALL = {"default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1}


def test_a_staged_database_is_copied_once_and_samples_the_same(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    stage = tmp_path / "stage"
    with headwater.Sampler(GOLDEN, **SMALL) as plain:
        expected = train_batches(plain, 3)
    capfd.readouterr()
    with headwater.Sampler(GOLDEN, stage_dir=str(stage), **SMALL) as s:
        path = Path(s.database_metadata()["databases"][0]["path"])
        got = train_batches(s, 3)
    assert "staged database `golden_v1`" in capfd.readouterr().err
    content_hash = json.loads((GOLDEN / "metadata.json").read_text())["content_hash"]
    assert path.parent == stage and (path / ".staged").read_text() == content_hash
    assert sorted(p.name for p in stage.iterdir()) == sorted([path.name, f".{path.name}.lock"])
    for a, b in zip(expected, got, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    # Staged already: read from the copy, nothing copied.
    with headwater.Sampler(GOLDEN, stage_dir=str(stage), **SMALL) as again:
        assert Path(again.database_metadata()["databases"][0]["path"]) == path
    assert "staged database" not in capfd.readouterr().err


def test_the_ranks_of_a_host_stage_once(tmp_path: Path) -> None:
    """Four processes started together: one copies, the others wait on the
    lock and read the same copy."""
    stage = tmp_path / "stage"
    code = (
        "import headwater, sys; "
        f"s = headwater.Sampler({str(GOLDEN)!r}, stage_dir={str(stage)!r}, "
        "default_batch_size=4, default_sequence_length=64, num_threads=1); "
        "s.next_train_batch(); print(s.database_metadata()['databases'][0]['path'])"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0].strip() for o in outs}) == 1
    assert sum("staged database" in o[1] for o in outs) == 1, [o[1] for o in outs]


def test_a_corrupt_source_is_never_staged(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(GOLDEN, bad)
    tables = sorted((bad / "tables").iterdir())[0]
    data = bytearray(tables.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tables.write_bytes(bytes(data))
    stage = tmp_path / "stage"
    with pytest.raises(headwater.HeadwaterError, match=r"tables/"):
        headwater.Sampler(bad, stage_dir=str(stage), **SMALL)
    assert not any(p.name.startswith("bad") for p in stage.iterdir())
    # With on_bad_database = "skip" it is dropped naming the file.
    with headwater.Sampler([GOLDEN, bad], stage_dir=str(stage), on_bad_database="skip",
                           **SMALL) as s:
        reason = s.database_metadata()["dropped_databases"][0]["reason"]
    assert "tables/" in reason, reason


def test_a_stage_dir_without_room_names_the_key_and_the_bytes(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr!r}")
    try:
        with pytest.raises(headwater.ConfigError) as e:
            headwater.Sampler(GOLDEN, stage_dir=str(small), **SMALL)
        msg = str(e.value)
        assert "`stage_dir`" in msg and "bytes free" in msg and "needs" in msg, msg
    finally:
        subprocess.run(["umount", str(small)], check=True)
