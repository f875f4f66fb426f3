"""Errors carry their fields as attributes, so nobody parses a message.

A sampler ``ConfigError`` names its key (``.key``), the offending value as
given (``.value``) and what is wrong (``.what``), whether it comes from
``Sampler(...)``, ``validate_sampler_config`` or ``headwater train --set``;
the train CLI's message names the key once. A ``StateError`` names its
``.field``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater import _native
from headwater.errors import ConfigError, StateError
from headwater.runconfig.config import load_config

N: Any = _native
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"
RANGE = next(f["range"] for f in N.sampler_config_schema() if f["name"] == "default_batch_size")


def _fields(e: BaseException) -> tuple[Any, Any, Any]:
    return getattr(e, "key", None), getattr(e, "value", None), getattr(e, "what", None)


@pytest.mark.parametrize(
    "make",
    [
        lambda: N.Sampler(GOLDEN, default_batch_size=0),
        lambda: N.Sampler(GOLDEN, config={"default_batch_size": 0}),
        lambda: N.validate_sampler_config({"default_batch_size": 0}),
    ],
    ids=["keyword", "config", "validate"],
)
def test_a_bad_value_carries_key_value_and_what(make: Any) -> None:
    with pytest.raises(ConfigError) as ei:
        make()
    e = ei.value
    assert _fields(e) == ("default_batch_size", "0", f"got 0, allowed: {RANGE}")
    assert str(e) == f"config `default_batch_size`: {e.what}"
    assert isinstance(e, ValueError) and isinstance(e, headwater.HeadwaterError)


def test_a_memory_budget_below_the_batches_in_flight_names_what_they_need(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """2 MiB cannot hold six batches of 32 x 1,024 cells (3 MB each): refused
    naming the key, the value and the bytes needed; 64 MiB opens."""
    keys = {"default_batch_size": 32, "default_sequence_length": 1024, "num_threads": 1}
    with pytest.raises(ConfigError) as ei:
        N.Sampler(GOLDEN, memory_budget=2 << 20, **keys)
    key, value, what = _fields(ei.value)
    assert (key, value) == ("memory_budget", str(2 << 20)), ei.value
    need = int(what.split("at least ")[1].split(" bytes")[0])
    assert 6 * 32 * 1024 * 80 < need < 6 * 32 * 1024 * 120, what
    assert "num_prefetch" in what, what
    with N.Sampler(GOLDEN, memory_budget=64 << 20, **keys) as s:
        assert s.next_train_batch()["is_padding"].shape == (32, 1024)
    assert "memory" not in capfd.readouterr().err


def test_a_wrong_type_carries_the_value_as_json() -> None:
    with pytest.raises(ConfigError) as ei:
        N.validate_sampler_config({"page_cache": "eager"})
    assert ei.value.key == "page_cache" and ei.value.value == '"eager"'
    with pytest.raises(ConfigError) as ei:
        N.Sampler(GOLDEN, pack="yes")
    assert (ei.value.key, ei.value.value) == ("pack", '"yes"')


def test_an_unknown_key_names_no_value() -> None:
    with pytest.raises(ConfigError) as ei:
        N.validate_sampler_config({"bogus_key": 1})
    assert ei.value.key == "bogus_key" and ei.value.value is None
    assert ei.value.what is not None and ei.value.what.startswith("unknown sampler key")


def test_a_config_error_raised_in_python_has_empty_fields() -> None:
    assert _fields(ConfigError("no key here")) == (None, None, None)
    assert _fields(StateError("no field here"))[:1] == (None,)


def test_set_names_the_key_once_and_carries_it() -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(None, **{"sampler.default_batch_size": 0})
    msg = str(ei.value)
    assert msg == (
        "the command line (--set sampler.default_batch_size=0): "
        f"`sampler.default_batch_size`: got 0, allowed: {RANGE}"
    )
    assert msg.count("default_batch_size") == 2, msg  # the flag as typed, the key once
    assert _fields(ei.value) == ("sampler.default_batch_size", "0", f"got 0, allowed: {RANGE}")


def test_a_file_value_names_its_line_and_the_key_once(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[sampler]\npage_cache = 'eager'\n", encoding="utf-8")
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}:2: `sampler.page_cache`: got \"eager\""), msg
    assert msg.count("page_cache") == 1, msg
    assert ei.value.key == "sampler.page_cache" and ei.value.value == '"eager"'


def test_the_train_cli_names_the_key_once(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "headwater.cli", "train", "--set", "sampler.default_batch_size=0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()[-1]
    assert err.endswith(
        "(--set sampler.default_batch_size=0): "
        f"`sampler.default_batch_size`: got 0, allowed: {RANGE}"
    ), err
    assert "config `" not in err, err


def test_a_state_error_carries_its_field() -> None:
    with N.Sampler(GOLDEN, default_batch_size=2, default_sequence_length=16) as s:
        st = s.state_dict()
    with pytest.raises(StateError) as ei:
        N.Sampler(GOLDEN, default_batch_size=2, default_sequence_length=16, seed=7, state=st)
    assert ei.value.field == "seed"
    assert ei.value.what is not None and str(ei.value) == f"sampler state `seed`: {ei.value.what}"
