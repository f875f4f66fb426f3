"""Verified reads seen from Python: open stays O(metadata), a corrupt block is a
`FormatError` naming the file and the block from the call that would have
delivered a batch built from it, and the `integrity/*` metrics say how the
bytes in the batches were checked (format 2: all of them; format 1: none)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from conftest import SmallData, SmallDb, build_small_db

from headwater import _native

N: Any = _native
GOLDEN_V1 = Path(__file__).parent.parent / "data" / "golden_v1"
GOLDEN_V2 = Path(__file__).parent.parent / "data" / "golden_v2"
TINY = {"default_batch_size": 8, "default_sequence_length": 64, "num_threads": 1}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> SmallDb:
    return build_small_db(tmp_path_factory.mktemp("integrity_small"), small_data)


def _integrity(s: Any) -> dict[str, float]:
    return {k.split("integrity/")[1]: v for k, v in s.drain_step_metrics().items() if "integrity/" in k}


def _first_data_byte(b: bytes) -> int:
    (n,) = struct.unpack_from("<I", b, 12)
    return (48 + 16 * n + 63) // 64 * 64


def test_format_2_reads_are_all_checked(small: SmallDb) -> None:
    s = N.Sampler(small.path, telemetry=True, num_threads=1)
    try:
        s.next_train_batch()
        m = _integrity(s)
    finally:
        s.shutdown()
    assert m["blocks_verified"] > 0 and m["unverified_reads"] == 0, m


@pytest.mark.parametrize(("db", "unverified"), [(GOLDEN_V1, True), (GOLDEN_V2, False)])
def test_format_1_reads_are_counted_unverified(db: Path, unverified: bool) -> None:
    for verify, want in (("header", unverified), ("full", False)):
        s = N.Sampler(db, telemetry=True, verify=verify, **TINY)
        try:
            s.next_train_batch()
            m = _integrity(s)
        finally:
            s.shutdown()
        assert (m["unverified_reads"] > 0) == want, (db.name, verify, m)


def test_a_corrupt_block_is_a_format_error_before_its_batch(small: SmallDb, tmp_path: Path) -> None:
    db = tmp_path / "db"
    shutil.copytree(small.path, db)
    g = db / "graph.bin"
    g.chmod(0o644)
    b = bytearray(g.read_bytes())
    b[_first_data_byte(b) + 1] ^= 0x10
    g.write_bytes(bytes(b))
    s = N.Sampler(db, num_threads=1)  # open reads no data byte: it succeeds
    try:
        # Graph blocks are 4 KiB (one page): the small database has several.
        with pytest.raises(N.FormatError, match=r"graph\.bin: .*corrupt data: block 0 of (?!1 )\d+ "):
            s.next_train_batch()
    finally:
        s.shutdown()
