"""A cold open reads what it uses: opening a database maps its files and
reads each one's header and block table, not the payload around them. The
kernel's read-ahead would otherwise pull in up to its window (128 KiB to
megabytes) around the header's page and again around the block table at the
file's end, for every file, before a batch asks for any of it.

Measured in a fresh process from the bytes it made the kernel read from
storage (``/proc/self/io``), with the database's pages evicted from the page
cache first (``posix_fadvise(DONTNEED)`` on its synced files: no root
needed). The copy lives on the repository's disk, not on a tmpfs, where
nothing is ever read from storage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import Tpch, drop_cached_pages

ROOT = Path(__file__).resolve().parents[2]

_OPEN = """
import sys, headwater
def read_bytes():
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
before = read_bytes()
headwater.Database(sys.argv[1])
print(read_bytes() - before)
"""


def test_a_cold_open_reads_headers_and_block_tables_not_the_payload(tpch: Tpch) -> None:
    scratch = ROOT / "target" / f"open-reads-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    db = scratch / "db"
    try:
        shutil.copytree(tpch.built.path, db)
        drop_cached_pages(db)
        files = [p for p in db.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        big = [p for p in files if p.stat().st_size > 1 << 20]
        assert len(big) >= 3, "the test needs files larger than a read-ahead window"
        r = subprocess.run(
            [sys.executable, "-c", _OPEN, str(db)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr[-2000:]
        read = int(r.stdout.split()[-1])
        # Per file a header (a page or two) and a block table (8 bytes per
        # 4 KiB block: 0.2 % of the data); read-ahead around either would
        # add at least 128 KiB for each large file.
        bound = 16 * 1024 * len(files) + size // 256
        assert read <= bound, f"a cold open read {read} bytes of {size}; expected at most {bound}"
        assert read > 0, "nothing was read from storage: the page cache was not evicted"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
