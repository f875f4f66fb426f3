"""The native tables hand Python the typed rows ``headwater.rows`` declares.

Every row of every native table function has exactly the fields of its
``TypedDict`` and values of the declared types (``Literal`` columns
included), so the stubs (``_native.pyi`` imports these rows) cannot drift
from the extension; the whole-config dict lists every sampler key in schema
order.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest

from headwater import _native, rows

N: Any = _native
GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "data" / "golden_v1"


def conforms(value: Any, t: Any) -> bool:
    """``value`` is of the (JSON-shaped) type ``t``."""
    origin = typing.get_origin(t)
    if t is Any:
        return True
    if t is type(None):
        return value is None
    if origin is Literal:
        return value in typing.get_args(t)
    if typing.is_typeddict(t):
        hints = typing.get_type_hints(t)
        return (
            isinstance(value, dict)
            and t.__required_keys__ <= set(value) <= set(hints)
            and all(conforms(v, hints[k]) for k, v in value.items())
        )
    if origin in (Union, types.UnionType):
        return any(conforms(value, a) for a in typing.get_args(t))
    if origin is list:
        (item,) = typing.get_args(t)
        return isinstance(value, list) and all(conforms(v, item) for v in value)
    if origin is dict:
        k, v = typing.get_args(t)
        return isinstance(value, dict) and all(
            conforms(a, k) and conforms(b, v) for a, b in value.items()
        )
    if t is float:
        return isinstance(value, float | int) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, t)


def check(got: list[Any], row: type) -> None:
    hints = typing.get_type_hints(row)
    assert got, row.__name__
    for r in got:
        assert set(r) == set(hints), (row.__name__, sorted(set(r) ^ set(hints)))
        for k, t in hints.items():
            assert conforms(r[k], t), (row.__name__, k, r[k], t)


def test_metric_table_rows() -> None:
    check(N.metric_table(), rows.MetricRow)


def test_trainer_gauge_rows() -> None:
    check(N.trainer_gauges(), rows.TrainerGaugeRow)


def test_telemetry_schema_entries() -> None:
    check(N.telemetry_schema_for(["a", "b"], 3, 64), rows.SchemaEntry)


def test_batch_tensor_rows() -> None:
    check(N.batch_tensors(), rows.TensorRow)


def test_config_key_rows_and_the_whole_config() -> None:
    schema = N.sampler_config_schema()
    check(schema, rows.ConfigKeyRow)
    assert list(typing.get_type_hints(rows.SamplerConfigDict)) == [f["name"] for f in schema]
    check([N.validate_sampler_config({})], rows.SamplerConfigDict)
    check(
        [N.validate_sampler_config({"task_weights": {"user_tier": 2.0}}, ["user_tier", "x"])],
        rows.SamplerConfigDict,
    )


def test_step_shapes() -> None:
    config = {"sequence_lengths": [64, 32], "tokens_per_batch": 128}
    check([N.step_shapes(config)], rows.StepShapes)


def test_sampler_reports() -> None:
    with N.Sampler(GOLDEN, default_batch_size=2, default_sequence_length=16) as s:
        check([s.config()], rows.SamplerConfigDict)
        check(s.telemetry_schema(), rows.SchemaEntry)
        check(s.eval_batches("val").tasks(), rows.EvalTaskRow)
    check([N.verify_database(GOLDEN)], rows.VerifyReport)


@pytest.mark.parametrize("pack", [False, True])
def test_bench_run(pack: bool) -> None:
    r = N.bench_sampler(GOLDEN, 1, 2, warmup=1, batch_size=2, sequence_length=32, pack=pack)
    check([r], rows.BenchRun)


def test_the_checker_refuses_a_wrong_row() -> None:
    row = N.metric_table()[0]
    with pytest.raises(AssertionError):
        check([{**row, "reduction": "MEAN"}], rows.MetricRow)
    with pytest.raises(AssertionError):
        check([{**row, "extra": 1}], rows.MetricRow)
    with pytest.raises(AssertionError):
        check([{**row, "per_task": 1}], rows.MetricRow)
