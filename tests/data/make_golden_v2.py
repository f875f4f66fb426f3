"""Build the golden format-v2 database under tests/data/golden_v2/.

The same tiny source as `make_golden_v1.py`, written by a build whose writer
emits format 2 (per-block checksums); run once per format version
(`python tests/data/make_golden_v2.py`). The Rust integration tests open the
committed result forever after, beside the v1 one, so a later build that
can no longer read either fails. `golden_v2_expected.json` is v1's expected
source values with the format version changed: the data are the same.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from make_golden_v1 import HERE, build_source

import headwater


def main() -> None:
    out = HERE / "golden_v2"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        build_source(src)
        if out.exists():
            shutil.rmtree(out)
        headwater.preprocess(src, out, schema=src / "schema.toml", embedder="hash", progress=False)
    expected = json.loads((HERE / "golden_v1_expected.json").read_text())
    expected["format_version"] = 2
    (HERE / "golden_v2_expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(headwater.Database(out).content_hash)


if __name__ == "__main__":
    main()
