"""Read an offline W&B run back from its ``.wandb`` file (for ``test_hook.py``).

``python read_wandb.py RUN.wandb`` prints JSON ``{"history": [row, ...],
"metrics": {name: {"step_metric", "summary": [...], "hidden"}}, "summary": {key:
value}}`` (the run summary's updates, the last value of each key).

The file is a 7-byte header (``:W&B``, magic 0xBEE1, version) followed by
leveldb-log blocks of 32 KiB; each record carries a CRC-32 of its type byte
and data, a little-endian length and a FULL / FIRST / MIDDLE / LAST type, and
never straddles a block (fewer than 7 bytes left in a block are padding).
A record cut short at the end of the file (a killed writer) ends the read.
The records are ``wandb_internal_pb2.Record`` messages, decoded here with
W&B's own protobuf types. A separate process because importing ``wandb``
creates temporary directories (under ``TMPDIR``, which the test points into
its own temporary tree).
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> list[bytes]:
    """The records of a LevelDB-style log: 32 KiB blocks of CRC-checked
    chunks (FULL, or FIRST + MIDDLE* + LAST)."""
    pos, raw, parts = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's trailer
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the next block
            pos += left
            continue
        payload = data[pos + 7 : pos + 7 + length]
        if len(payload) < length:  # a torn tail: the writer was killed
            break
        if zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad CRC at byte {pos}")
        pos += 7 + length
        if kind not in (FULL, FIRST, MIDDLE, LAST):
            raise ValueError(f"unknown record type {kind} at byte {pos}")
        parts = payload if kind in (FULL, FIRST) else parts + payload
        if kind in (FULL, LAST):
            raw.append(parts)
    return raw


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    if (ident, magic) != (b":W&B", 0xBEE1):
        raise ValueError(f"not a .wandb file: {ident!r} {magic:#x}")
    out = []
    for r in _chunks(data):
        rec = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module
        rec.ParseFromString(r)
        out.append(rec)
    return out


def main() -> None:
    recs = records(Path(sys.argv[1]))
    history = []
    metrics: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for r in recs:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            history.append(row)
        elif kind == "summary":
            for item in r.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "metric":
            m = r.metric
            metrics[m.name or m.glob_name] = {
                "step_metric": m.step_metric,
                "summary": sorted(f.name for f, v in m.summary.ListFields() if v),
                "hidden": bool(m.options.hidden),
            }
    json.dump({"history": history, "metrics": metrics, "summary": summary}, sys.stdout)


if __name__ == "__main__":
    main()
