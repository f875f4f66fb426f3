"""Variable length at a fixed token budget (``sampler.sequence_lengths`` with
``tokens_per_batch``): the Python sampler's batches and errors, and a tiny
``headwater train`` run over two lengths whose train step compiles once per
``S`` (docs/sampling.md and docs/training.md, "Variable length").
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
from conftest import Tpch, tiny_train_config

import headwater
from headwater import _native
from headwater.errors import ConfigError


def test_batches_fill_the_budget_and_state_names_the_keys(tpch: Tpch) -> None:
    kw = {"sequence_lengths": [32, 64, 128], "tokens_per_batch": 512, "num_threads": 1}
    with headwater.Sampler(str(tpch.built.path), **kw) as s:
        shapes = [s.next_train_batch()["is_padding"].shape for _ in range(12)]
        state = s.state_dict()
        drained = s.drain_step_metrics()
    assert all(b * n == 512 for b, n in shapes), shapes
    assert {n for _, n in shapes} == {32, 64, 128}, shapes
    assert state["config"]["sequence_lengths"] == [32, 64, 128]
    assert state["config"]["tokens_per_batch"] == 512
    assert drained["sampler/batch/seq_len_max"] == max(n for _, n in shapes)
    # The resumed stream draws the same S; another budget is refused by name.
    with headwater.Sampler(str(tpch.built.path), state=state, **kw) as r:
        again = [r.next_train_batch()["is_padding"].shape for _ in range(4)]
    with headwater.Sampler(str(tpch.built.path), **kw) as w:
        whole = [w.next_train_batch()["is_padding"].shape for _ in range(16)]
    assert again == whole[12:]
    with pytest.raises(_native.StateError, match="tokens_per_batch"):
        headwater.Sampler(str(tpch.built.path), state=state, **{**kw, "tokens_per_batch": 1024})


@pytest.mark.parametrize(
    ("kw", "key", "value"),
    [
        ({"sequence_lengths": [], "tokens_per_batch": 512}, "sequence_lengths", "[]"),
        ({"sequence_lengths": [64]}, "tokens_per_batch", "None"),
        ({"sequence_lengths": [0, 64], "tokens_per_batch": 512}, "sequence_lengths", "holds 0"),
        ({"sequence_lengths": [70000], "tokens_per_batch": 70000}, "sequence_lengths", "70000"),
        ({"sequence_lengths": [64, 96], "tokens_per_batch": 512}, "tokens_per_batch", "S = 96"),
        ({"sequence_lengths": [1024], "tokens_per_batch": 512}, "tokens_per_batch", "smaller"),
    ],
)
def test_bad_length_recipes_name_key_value_and_range(
    tpch: Tpch, kw: dict[str, object], key: str, value: str
) -> None:
    with pytest.raises(ConfigError) as e:
        headwater.Sampler(str(tpch.built.path), **kw)
    assert e.value.key == key and value in str(e.value.value), (e.value.key, e.value.value)
    field = next(f for f in _native.sampler_config_schema() if f["name"] == key)
    assert field["range"] in str(e.value) and field["stream"]


def _config(db: Path, steps: int, sampler: str, train: str = "") -> str:
    cfg = tiny_train_config(db, steps, train=f"val_every = 4\neval_final = false\n{train}")
    return cfg.replace("num_threads = 1\n", f"num_threads = 1\n{sampler}\n")


def test_grad_accum_must_divide_every_steps_batch(tpch: Tpch) -> None:
    from headwater.runconfig.config import load_config

    text = _config(
        tpch.built.path, 4, "sequence_lengths = [16, 64]\ntokens_per_batch = 64", "grad_accum = 2"
    )
    with pytest.raises(ConfigError, match=r"tokens_per_batch` = 64 / S = 64 is B = 1"):
        load_config(tomllib.loads(text))


def test_a_token_budget_below_one_sequence_is_refused_before_training(tpch: Tpch) -> None:
    from headwater.runconfig.config import load_config

    text = _config(tpch.built.path, 4, "sequence_lengths = [64, 128]\ntokens_per_batch = 64")
    with pytest.raises(ConfigError, match=r"`sampler.tokens_per_batch`: got 64, smaller than one"):
        load_config(tomllib.loads(text))


def test_two_processes_train_two_lengths_compiling_once_per_length(
    tmp_path: Path, tpch: Tpch
) -> None:
    """Two data-parallel processes: the same S at every step on both ranks
    (their collectives pair up and the parameters end bit-identical). 64
    cells per rank per step hold at most 64 texts and 32 rows: the padding
    buckets never grow (64), so every compilation is a new S."""
    from test_train import run_train, summaries

    steps = 8
    text = _config(tpch.built.path, steps, "sequence_lengths = [16, 32]\ntokens_per_batch = 64")
    r = run_train(
        tmp_path, text, "--num-processes", "2", "--run-name", "varlen", "--wandb-mode", "disabled"
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s0, s1 = summaries(tmp_path, "varlen", 2)
    assert s0["param_digest"] == s1["param_digest"] and s0["losses"] == s1["losses"]
    by_len = s0["steps_by_seq_len"]
    assert by_len == s1["steps_by_seq_len"]
    assert set(by_len) == {"16", "32"} and sum(by_len.values()) == steps, by_len
    assert s0["train_step_compiles"] == s1["train_step_compiles"] == 2
    assert math.isfinite(s0["loss_end"]) and math.isfinite(s0["final_val_loss"])
    # Tokens/s counts the steps' real B·S: 64 per rank per step.
    tp = s0["throughput"]
    assert tp["tokens_per_second"] == pytest.approx(64 * s0["batches_per_second"], rel=1e-9)
    assert "S in [16, 32] at 64 tokens per rank" in r.stdout
    assert "global B×S 8×16, 4×32" in r.stdout


def test_the_padder_keeps_one_high_water_mark_per_length(tpch: Tpch) -> None:
    """A step of short sequences is not padded to the rows a long step
    reached (its ``[B, R, R]`` adjacency would grow with the long S)."""
    pytest.importorskip("jax")
    from headwater.cluster.mesh import Mesh
    from headwater.evaluation.padder import Padder

    def batch(s: int, b: int) -> dict[str, object]:
        kw = {"default_sequence_length": s, "default_batch_size": b, "num_threads": 1}
        kw |= {"bfs_child_width": 256, "max_hops": 6}
        with headwater.Sampler(str(tpch.built.path), **kw) as sm:
            return dict(sm.next_train_batch())

    long, short = batch(8192, 2), batch(16, 8)
    assert long["fk_adj"].shape[1] > 64 >= short["fk_adj"].shape[1]
    pad = Padder(Mesh(), max_categories=8)
    assert pad(long)["fk_adj"].shape[1] > 64
    assert pad(short)["fk_adj"].shape == (8, 64, 64)
    assert sorted(pad.marks) == [16, 8192]
