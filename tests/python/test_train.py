"""``headwater train``: the config checks, one- and two-process runs, failures.

Every run is the real command (``headwater train``) in a subprocess on the
session's TPC-H database, with a tiny model so a step takes milliseconds:

* two processes on one loopback ``jax.distributed`` job end with identical
  parameters (digest) and identical losses, and the reduced telemetry is in
  rank 0's offline W&B run once per step (read back from the ``.wandb``
  file) and nowhere else;
* one process: the loss falls, the profile accounts for the whole step;
* a rank that fails stops the others, and the error names it;
* unknown keys, ill-typed or invalid values, unknown tasks and out-of-range
  ranks are errors naming the key.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Tpch, child_env, free_port, read_wandb_run

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("wandb")

from conftest import tiny_train_config

from headwater.errors import ConfigError
from headwater.runconfig.config import load_config

STEPS = 6


def tiny_config(db: Path, **extra: str) -> str:
    """A TOML config for a fast run on ``db``; ``extra`` adds sections verbatim."""
    return tiny_train_config(
        db, STEPS, train="val_every = 3\neval_final = false", extra="\n".join(extra.values())
    )


def run_train(
    tmp_path: Path, config: str, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "train.toml"
    cfg.write_text(config, encoding="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "headwater.cli",
            "train",
            str(cfg),
            "--dir",
            str(tmp_path / "runs"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(tmp_path),
        check=False,
    )


def summaries(tmp_path: Path, name: str, world: int) -> list[dict[str, Any]]:
    import json

    return [
        json.loads((tmp_path / "runs" / name / f"rank-{r}.json").read_text()) for r in range(world)
    ]


# ----------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------


def test_two_processes_train_identically_and_log_once(tmp_path: Path, tpch: Tpch) -> None:
    r = run_train(
        tmp_path,
        tiny_config(tpch.built.path),
        "--num-processes",
        "2",
        "--run-name",
        "two",
        "--set",
        "train.log_every=2",
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s0, s1 = summaries(tmp_path, "two", 2)
    assert (s0["world"], s1["world"], s0["steps"], s1["steps"]) == (2, 2, STEPS, STEPS)
    # Same averaged gradients on both ranks: the same parameters, bit for bit,
    # and the same (pmean-ed) losses.
    assert s0["config"]["train"]["log_every"] == 2  # --set reached both ranks
    assert s1["config"]["train"]["log_every"] == 2
    assert s0["param_digest"] == s1["param_digest"]
    assert s0["losses"] == s1["losses"]
    assert s0["telemetry_rows_logged"] == STEPS and s1["telemetry_rows_logged"] == 0
    assert s1["wandb_dir"] is None
    assert "W&B run (offline)" in r.stdout and s0["wandb_dir"] in r.stdout
    assert "sampler health: ok" in r.stdout

    run = read_wandb_run(Path(s0["wandb_dir"]), child_env(tmp_path))
    hist = run["history"]
    tele = [row for row in hist if "sampler/batches" in row]
    # One reduced row per step, each the cluster total of one batch per rank.
    assert [row["trainer/step"] for row in tele] == list(range(STEPS))
    assert all(row["sampler/batches"] == 2.0 for row in tele)
    assert all(row["sampler/batches_max"] == 1.0 for row in tele)
    trainer = [row for row in hist if "trainer/loss" in row]
    assert [row["trainer/step"] for row in trainer] == list(range(STEPS))
    assert [row["trainer/loss"] for row in trainer] == pytest.approx(s0["losses"], rel=1e-6)
    assert all(0.0 <= row["trainer/data_wait_share"] <= 1.0 for row in trainer)
    assert [row["trainer/step"] for row in hist if "val/loss" in row] == [2, STEPS - 1]
    # No other process wrote a W&B run.
    assert len(list((tmp_path / "runs" / "two").rglob("run-*.wandb"))) == 1


def test_one_process_loss_falls_and_profile_accounts_for_the_step(
    tmp_path: Path, tpch: Tpch
) -> None:
    # 60 steps, as test_checkpoint's Ctrl-C run (the same compiled train step:
    # in the full suite this run loads it from the session's cache).
    cfg = tiny_config(tpch.built.path).replace(f"steps = {STEPS}", "steps = 60")
    r = run_train(tmp_path, cfg, "--profile", "--run-name", "one", "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    (s,) = summaries(tmp_path, "one", 1)
    assert s["steps"] == 60 and s["steady_steps"] == 59
    assert s["loss_end"] < 0.7 * s["loss_start"], (s["loss_start"], s["loss_end"])
    for phase in ("sample_wait", "host_to_device", "compute", "telemetry", "other"):
        assert phase in r.stdout
        assert s["phase_seconds_mean"][phase] >= 0
    assert s["phase_seconds_mean"]["compute"] > 0
    # The steady steps the profile covers fit in the run's own wall clock.
    steady = s["steady_steps"] * sum(s["phase_seconds_mean"].values())
    assert 0 < steady <= s["wall_seconds"]
    assert s["invariants"] == {
        "sampler/invariants/duplicate_seeds": 0.0,
        "sampler/invariants/temporal_leaks": 0.0,
        "sampler/invariants/label_leaks": 0.0,
    }
    # Headspace: the step rate without the sampler, measured by replaying a
    # cached batch.
    hs = s["headspace"]
    assert hs["needed_from"] == "replayed"
    assert 0 < hs["needed_batches_per_second"] < float("inf")
    assert hs["ratio"] == hs["sampler_batches_per_second"] / hs["needed_batches_per_second"]
    assert "replayed;" in r.stdout
    # Throughput: tokens/s and model FLOPs; no MFU on a CPU (no known peak).
    tp = s["throughput"]
    assert tp["tokens_per_second"] > 0 and tp["model_flops_per_step"] > 0
    assert tp["mfu"] is None and "MFU not known" in r.stdout


def test_the_input_verdict_judges_the_summarys_steady_steps(tmp_path: Path, tpch: Tpch) -> None:
    """The run's verdict divides the same waits by the same step times over the
    same steps after warm-up as the summary's data wait share: one process, so
    the two are one number, and the verdict is ``ok`` exactly when it is
    at most 5 %. ``log_every = 3``: the device time lands in every third step."""
    import json

    from headwater.train.verdict import VERDICTS

    cfg = tiny_config(tpch.built.path).replace("log_every = 1", "log_every = 3")
    r = run_train(tmp_path, cfg, "--run-name", "v", "--wandb-mode", "disabled")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    (s,) = summaries(tmp_path, "v", 1)
    assert s["verdict_steps"] == s["steady_steps"] == STEPS - 1
    assert s["verdict_wait_share"] == pytest.approx(s["data_wait_share"], rel=1e-9, abs=1e-12)
    assert (s["verdict"] == "ok") == (s["data_wait_share"] <= 0.05), s["verdict_reason"]
    if s["verdict"] == "ok":
        assert f"waits {100 * s['data_wait_share']:.1f}% of the step" in s["verdict_reason"]
    # The live verdict: its window (20 steady steps) holds the whole run here,
    # so the last row's verdict is the run's.
    rows = [json.loads(x) for x in (tmp_path / "runs" / "v" / "metrics.jsonl").open()]
    codes = [x["trainer/verdict"] for x in rows if "trainer/verdict" in x]
    assert len(codes) == STEPS and codes[-1] == VERDICTS.index(s["verdict"])


def _worker_pids(marker: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "headwater.train" in cmd and marker in cmd:
                pids.append(int(d.name))
    return pids


def test_a_failing_rank_stops_the_others(tmp_path: Path, tpch: Tpch) -> None:
    """Rank 1 cannot bind its Prometheus port (base + 1, held here): it fails
    at start while rank 0 waits in the job; the launcher reports rank 1 under
    the key that caused it and stops rank 0 within seconds."""
    import socket

    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        cfg = tiny_config(tpch.built.path).replace(
            "prometheus_port = 0", f"prometheus_port = {port}"
        )
        t0 = time.monotonic()
        r = run_train(tmp_path, cfg, "--num-processes", "2", "--run-name", "fails", timeout=120)
        took = time.monotonic() - t0
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "rank 1" in r.stderr and "the other ranks were stopped" in r.stderr
    assert "`logging.prometheus_port`" in r.stderr and "--prometheus-port" in r.stderr
    assert f"{port + 1}" in r.stderr, r.stderr[-3000:]
    assert _worker_pids(str(tmp_path / "runs" / "fails")) == []
    assert took < 60, took  # not a collective's timeout


def test_bad_sampler_values_and_tasks_name_the_key(tmp_path: Path, tpch: Tpch) -> None:
    """Rejected before any training (in this process: no run is started)."""
    import tomllib

    from headwater.train import launch

    def fails(extra: str, message: str, processes: int = 1, db: Path = tpch.built.path) -> None:
        cfg = tomllib.loads(tiny_config(db, x=extra))
        cfg["logging"].update(wandb_mode="disabled", dir=str(tmp_path / "runs"))
        with pytest.raises(ConfigError) as e:
            launch(cfg, num_processes=processes)
        assert message in str(e.value)
        assert "config `" not in str(e.value), e.value  # the key is named once

    fails("[ranks.0]\nnum_prefetch = 0\n", "`ranks.0.num_prefetch`")
    fails("[sampler.task_weights]\nno_such_task = 2.0\n", "no_such_task")
    fails("[ranks.3]\nnum_prefetch = 2\n", "ranks.3", processes=2)
    fails("[ranks.0]\ndebug_batch_delay_ms = -1.0\n", "`ranks.0.debug_batch_delay_ms`")
    fails("[ranks.1]\npool_fraction = 0.5\n", "`ranks.1.pool_fraction`", processes=2)
    fails("", "database.path", db=tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="num-processes"):
        launch(None, num_processes=0)
    # No failed start left a run directory behind.
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []


def test_a_port_clash_names_the_logging_key_and_leaves_no_run_dir(
    tmp_path: Path, tpch: Tpch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A start that fails (the exporter's port is taken) names the key, and
    announces no run directory and no resume command: it leaves none."""
    import socket
    import tomllib

    from headwater.train import launch

    port = free_port()
    cfg = tomllib.loads(tiny_config(tpch.built.path))
    cfg["logging"].update(wandb_mode="disabled", dir=str(tmp_path / "runs"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        with pytest.raises(ConfigError) as e:
            launch(cfg, run_name="clash", **{"logging.prometheus_port": port})
    msg = str(e.value)
    assert "`logging.prometheus_port`" in msg and "--prometheus-port" in msg, msg
    assert "[sampler]" not in msg and str(port) in msg
    # Named once (not again as "config `prometheus_port`"), with the way out.
    assert "config `prometheus_port`" not in msg and "`--prometheus-port auto`" in msg, msg
    assert not (tmp_path / "runs" / "clash").exists()
    out = capsys.readouterr().out
    assert "run directory:" not in out and "resume with" not in out, out


# ----------------------------------------------------------------------------
# Config checks (no run)
# ----------------------------------------------------------------------------

BAD_CONFIGS = [
    ("[modle]\nd_model = 8\n", "`modle` (did you mean `model`?)"),
    ("[model]\ndmodel = 8\n", "`model.dmodel` (did you mean `model.d_model`?)"),
    ("[model]\nzzz = 8\n", "unknown key `model.zzz` (known:"),
    ("[sampler]\nnum_thread = 2\n", "did you mean `num_threads`?"),
    ("[model]\nd_model = 'big'\n", "`model.d_model` must be an integer"),
    ("[model]\nd_model = 30\nnum_heads = 4\n", "[model] num_heads (4) must divide d_model (30)"),
    ("[optim]\nlearning_rate = -1.0\n", "[optim]"),
    ("[train]\nsteps = 0\n", "[train] steps must be > 0"),
    ("[sampler]\nrank = 1\n", "`sampler.rank` cannot be set here (set by the launcher"),
    ("[sampler]\nprometheus_port = 9000\n", "set it under [logging]"),
    ("[sampler]\ndefault_batch_size = 4.5\n", "`sampler.default_batch_size`"),
    ("[sampler.task_weights]\na = 'x'\n", "`sampler.task_weights`"),
    # An unquoted task name with a dot is read as nested tables: say to quote it.
    (
        "[sampler.task_weights]\norders.status = 1\n",
        'the unquoted task name `orders.status` as nested tables; quote a name that holds a '
        'dot: "orders.status" = ...',
    ),
    ("[ranks.x]\nnum_prefetch = 2\n", "`ranks.x`"),
    ("[ranks.1]\nbfs_width = 3\n", "`ranks.1.bfs_width`"),
    ("[sampler]\ndefault_batch_size = 0\n", "`sampler.default_batch_size`"),
    ("[sampler]\nnum_prefetch = -1\n", "`sampler.num_prefetch`"),
    ("[logging]\nwandb_mode = 'sometimes'\n", "wandb_mode must be offline, online or disabled"),
    ("steps = 5\n", "`steps`"),
    ("[train\nsteps = 5\n", "invalid TOML"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS)
def test_config_errors_name_the_key_and_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_every_bad_sampler_key_is_reported_at_once_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        "[sampler]\nmax_hops = 65\nnum_prefetch = 2\ndefault_batch_size = 0\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError) as e:
        load_config(path, **{"sampler.seed_windows": 0})
    lines = str(e.value).splitlines()
    assert lines[0] == "3 bad sampler keys:", lines
    assert f"{path}:4: `sampler.default_batch_size`: got 0" in lines[1], lines
    assert f"{path}:2: `sampler.max_hops`: got 65" in lines[2], lines
    assert "--set sampler.seed_windows" in lines[3] and "got 0" in lines[3], lines
    assert e.value.key == "sampler.default_batch_size"


def test_a_set_with_an_unquoted_dotted_name_says_to_quote_it() -> None:
    from headwater.runconfig.origins import parse_overrides

    with pytest.raises(ConfigError) as e:
        parse_overrides(["sampler.task_weights={orders.status=1}"])
    msg = str(e.value)
    assert "`orders.status`" in msg and 'sampler.task_weights={"orders.status"=...}' in msg, msg
    quoted = parse_overrides(['sampler.task_weights={"orders.status"=1}'])
    assert quoted == {"sampler.task_weights": {"orders.status": 1}}


def test_an_unknown_task_weight_says_which_task_it_looks_like() -> None:
    from headwater.runconfig import sampler_config as SC
    from headwater.runconfig.origins import Origins

    names = ["customers.age", "orders.status", "orders.amount"]
    with pytest.raises(ConfigError) as e:
        SC.check_table([("sampler", {"task_weights": {"orders.statsu": 1.0}})], Origins("c.toml"), names)
    assert '"orders.statsu"' in str(e.value) and "(did you mean `orders.status`?)" in str(e.value)
    SC.check_table([("sampler", {"task_weights": {"orders.status": 1.0}})], Origins("c.toml"), names)


def test_a_set_of_a_rank_key_reaches_the_ranks_table() -> None:
    """``--set ranks.1.num_threads=2`` sets rank 1's key (it read `1.num_threads`
    as the rank and refused it); a typo there gets the sampler's hint."""
    from headwater.runconfig.origins import parse_overrides

    cfg = load_config(None, **parse_overrides(["ranks.1.num_threads=2", "ranks.1.num_prefetch=3"]))
    assert cfg.ranks[1] == {"num_threads": 2, "num_prefetch": 3}
    assert cfg.where("ranks", "1") == "the command line (--set ranks.1.num_threads=2)"
    with pytest.raises(ConfigError) as e:
        load_config(None, **parse_overrides(["ranks.0.num_thread=2"]))
    assert "`ranks.0.num_thread`" in str(e.value) and "did you mean `num_threads`?" in str(e.value)


def test_config_defaults_and_overrides(tmp_path: Path) -> None:
    cfg = load_config(None)
    assert cfg.sampler_kwargs(0)["default_batch_size"] == 8  # the CPU main job's size
    assert cfg.optim.total_steps == cfg.train.steps and cfg.auto_categories
    path = tmp_path / "c.toml"
    path.write_text("[sampler]\nsplit_ratios = [0.5, 0.25, 0.25]\n[ranks.1]\nnum_prefetch = 2\n")
    cfg = load_config(path, **{"train.steps": 40})
    assert cfg.train.steps == 40 and cfg.optim.total_steps == 40 and cfg.optim.warmup_steps == 4
    assert cfg.sampler_kwargs(0)["split_ratios"] == (0.5, 0.25, 0.25)
    assert cfg.sampler_kwargs(1)["num_prefetch"] == 2
    assert cfg.sampler_kwargs(0)["num_prefetch"] == 4  # the trainer's default
    assert cfg.sampler_kwargs(1)["split_ratios"] == (0.5, 0.25, 0.25)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml")


#: The keys a saved sampler state records (docs/sampling.md and docs/contexts.md, Resume): they define the
#: one global stream every rank reads, so no rank may set its own.
STREAM_KEYS = {
    "split_ratios",
    "split_seed",
    "seed",
    "task_weights",
    "task_pick",
    "task_mixing",  # docs/sampling.md, Mixed-task batches
    "default_batch_size",
    "default_sequence_length",
    "bfs_child_width",
    "max_hops",
    "temporal_filter",
    "pool_fraction",
    "seed_windows",  # docs/sampling.md, Memory
    "hot_set_bytes",  # docs/sampling.md, Memory (hot sets)
    "hot_set_steps",
    "pack",
    "pack_factor",
    "database_weights",
    "sequence_lengths",
    "tokens_per_batch",
    # the in-context recipe (docs/contexts.md, Resume)
    "examples",
    "local_context_sizes",
    "bfs_widths",
    "prefer_latest",
    "num_walks",
    "walk_length",
    "example_ranker",
    "expected_prune",
    "mask_prob_max",
}


def test_stream_keys_come_from_the_sampler_schema() -> None:
    from headwater.runconfig.sampler_config import stream_keys

    assert stream_keys() == STREAM_KEYS


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


@pytest.mark.parametrize("key", sorted(STREAM_KEYS))
def test_a_rank_cannot_override_a_stream_key(tmp_path: Path, key: str) -> None:
    from headwater import _native

    default = next(f["default"] for f in _native.sampler_config_schema() if f["name"] == key)
    # Even the value [sampler] has is refused: the key has no per-rank meaning.
    special = {
        "task_weights": "{ order_status = 2.0 }",
        "database_weights": "[1.0]",
        "tokens_per_batch": "1024",
        "hot_set_bytes": "1048576",
    }
    value = special.get(key) or _toml_value(default)
    # A key valid only beside another: the other set for every rank.
    partner = {"tokens_per_batch": "sequence_lengths = [1024]\n"}.get(key, "")
    sampler = f"[sampler]\n{partner}{key} = {value}\n"
    head = (f"{sampler}\n" if partner else "") + "[train]\nsteps = 5\n\n"
    path = tmp_path / "c.toml"
    path.write_text(f"{head}[ranks.1]\n{key} = {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    line = head.count("\n") + 2
    assert msg.startswith(f"{path}:{line}: `ranks.1.{key}` cannot be set for rank 1 alone"), msg
    assert "defines the batch stream" in msg and "[sampler]" in msg, msg
    # The same key under [sampler] (every rank) is accepted.
    path.write_text(sampler, encoding="utf-8")
    assert key in load_config(path).sampler_kwargs(1)


def test_a_rank_may_override_keys_outside_the_stream(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[ranks.1]\nnum_threads = 2\nnum_prefetch = 1\ndebug_batch_delay_ms = 50.0\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert {k: cfg.sampler_kwargs(1)[k] for k in ("num_threads", "num_prefetch")} == {
        "num_threads": 2,
        "num_prefetch": 1,
    }
    assert cfg.sampler_kwargs(1)["debug_batch_delay_ms"] == 50.0
    assert "debug_batch_delay_ms" not in cfg.sampler_kwargs(0)


def test_config_errors_point_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("# a comment\n[train]\nval_every = 5\nsteps = 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"^{path}:4: "):
        load_config(path)
    path.write_text("[model]\nd_model = 8\n\n[sampler]\nnum_threads = 'two'\n")
    with pytest.raises(ConfigError, match=f"^{path}:5: `sampler.num_threads`"):
        load_config(path)


def test_one_range_per_key_wherever_the_value_came_from(tmp_path: Path) -> None:
    """``-1`` and ``0`` break the same rule: the same range, and the error
    says the value came from ``--set``."""
    errors = []
    for bad in (-1, 0):
        with pytest.raises(ConfigError) as e:
            load_config(None, **{"sampler.default_batch_size": bad})
        errors.append(str(e.value))
    for msg in errors:
        assert msg.startswith("the command line (--set sampler.default_batch_size="), msg
    ranges = [re.findall(r"\d+\s*\.\.=?\s*\d+", m) for m in errors]
    assert ranges[0] and ranges[0] == ranges[1], errors
    path = tmp_path / "c.toml"
    path.write_text("[sampler]\ndefault_batch_size = -1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}:2: ") and ranges[0][0] in str(e.value)


def test_docs_state_the_trainers_sampler_defaults() -> None:
    from headwater.runconfig.sampler_config import TRAINER_DEFAULTS

    readme = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(
        encoding="utf-8"
    )
    d = TRAINER_DEFAULTS
    stated = (
        f"(`B = {d['default_batch_size']}`, `S = {d['default_sequence_length']}`, "
        f"one thread, four prefetch slots)"
    )
    assert " ".join(stated.split()) in " ".join(readme.split())
    assert (d["num_threads"], d["num_prefetch"]) == (1, 4)
    cfg = load_config(None)
    assert {k: cfg.sampler_kwargs(0)[k] for k in d} == d


def test_the_step_loop_never_syncs_the_device_per_step(
    tmp_path: Path, tpch: Tpch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a step (outside the every-``log_every`` flush), nothing on the
    loop's thread brings a device value to the host: every host conversion and wait of a
    ``jax.Array`` (``_value``, ``__array__``, ``__float__``, ``item``,
    ``block_until_ready``) and the trainer's ``host`` is counted; the
    trainer's metrics arrive in one ``device_get`` per ``log_every`` steps."""
    import jax
    from jax._src.array import ArrayImpl

    from headwater.cluster import mesh
    from headwater.train import launcher, loop
    from headwater.train.loop import Trainer

    state = {"in_step": False, "syncs": [], "device_gets": 0}

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            # The loop's thread only: the prefetch thread waits for its own
            # host-to-device copies (that is what it is for).
            if state["in_step"] and threading.current_thread() is threading.main_thread():
                state["syncs"].append(name)
            return fn(*a, **kw)

        return wrapper

    for name in ("__array__", "__float__", "__int__", "__bool__", "item", "block_until_ready"):
        monkeypatch.setattr(ArrayImpl, name, counting(name, getattr(ArrayImpl, name)))
    value = ArrayImpl._value
    monkeypatch.setattr(ArrayImpl, "_value", property(counting("_value", value.fget)))
    monkeypatch.setattr(
        jax, "block_until_ready", counting("jax.block_until_ready", jax.block_until_ready)
    )
    # NumPy reads a CPU array through the buffer protocol (no Python hook):
    # the trainer converts through ``host``, counted in both modules.
    monkeypatch.setattr(loop, "host", counting("host", loop.host))
    monkeypatch.setattr(mesh, "host", counting("host", mesh.host))
    real_get, real_step, real_flush = jax.device_get, Trainer.step, Trainer._flush

    def device_get(x: Any) -> Any:
        state["device_gets"] += 1
        return real_get(x)

    def step(self: Trainer, i: int, prefetch: bool = True) -> None:
        state["in_step"] = True
        try:
            real_step(self, i, prefetch)
        finally:
            state["in_step"] = False

    def flush(self: Trainer) -> float:
        was, state["in_step"] = state["in_step"], False
        try:
            return real_flush(self)
        finally:
            state["in_step"] = was

    monkeypatch.setattr(jax, "device_get", device_get)
    monkeypatch.setattr(Trainer, "step", step)
    monkeypatch.setattr(Trainer, "_flush", flush)
    cfg = tmp_path / "train.toml"
    cfg.write_text(tiny_config(tpch.built.path), encoding="utf-8")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HEADWATER_CACHE_DIR", str(tmp_path / "cache"))
    (summary,) = launcher.launch(
        cfg,
        run_name="nosync",
        **{
            "train.steps": 12,
            "train.log_every": 4,
            "train.val_every": 0,
            "train.val_batches": 0,
            "logging.wandb_mode": "disabled",
            "logging.dir": str(tmp_path / "runs"),
        },
    )
    assert summary["steps"] == 12 and len(summary["losses"]) == 12
    assert state["syncs"] == []
    assert state["device_gets"] == 3


TRAINER_GAUGE_CHILD = """
import json, sys, time, urllib.request
from headwater import _native as N

db, port = sys.argv[1], int(sys.argv[2])
s = N.Sampler(db, rank=1, world_size=2, prometheus_port=port, local_rank=0,
              default_batch_size=4, default_sequence_length=64)
s.export_trainer({"trainer/verdict": 2.0, "trainer/verdict_rank": 1.0,
                  "trainer/data_wait_share": 0.4, "trainer/headspace_ratio": 0.5})
try:
    s.export_trainer({"trainer/verdit": 1.0})
    err = None
except ValueError as e:
    err = str(e)

def scrape():
    for attempt in range(50):
        try:
            return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read()
        except OSError:
            time.sleep(0.1)

# MFU: not set on a device without a known peak (a CPU), so not served.
before = scrape()
s.export_trainer({"trainer/mfu": 0.25})
text = scrape()
s.shutdown()
print(json.dumps({"text": text.decode(), "before": before.decode(), "err": err}))
"""


def test_the_trainer_gauges_are_served_on_the_ranks_exporter(tmp_path: Path, tpch: Tpch) -> None:
    """``export_trainer``: every row of the trainer gauge table is served
    with the rank's label and help; an unknown key names the known ones."""
    import json

    from headwater import _native

    port = free_port()
    r = subprocess.run(
        [sys.executable, "-c", TRAINER_GAUGE_CHILD, str(tpch.built.path), str(port)],
        capture_output=True,
        text=True,
        env=child_env(tmp_path),
        timeout=120,
        check=True,
    )
    out = json.loads(r.stdout.strip().splitlines()[-1])
    want = {
        "headwater_trainer_verdict": 2.0,
        "headwater_trainer_verdict_rank": 1.0,
        "headwater_trainer_data_wait_ratio": 0.4,
        "headwater_trainer_headspace_ratio": 0.5,
        "headwater_trainer_mfu_ratio": 0.25,
    }
    assert [g["prometheus"] for g in _native.trainer_gauges()] == list(want)
    assert "headwater_trainer_mfu_ratio{" not in out["before"]
    assert 'headwater_trainer_verdict{rank="1"}' in out["before"]
    for name, value in want.items():
        assert f'{name}{{rank="1"}} {value:g}' in out["text"], (name, out["text"][-3000:])
        assert f"# HELP {name} " in out["text"]
    assert out["err"] is not None and "trainer/verdit" in out["err"]
    assert "trainer/verdict" in out["err"].split("known:")[1]


def test_a_set_error_names_the_key_once(
    tmp_path: Path, tpch: Tpch, capsys: pytest.CaptureFixture[str]
) -> None:
    from headwater.cli import main

    cfg = tmp_path / "train.toml"
    cfg.write_text(tiny_config(tpch.built.path), encoding="utf-8")
    rc = main(
        ["train", str(cfg), "--dir", str(tmp_path / "runs"), "--wandb-mode", "disabled",
         "--set", "sampler.num_prefetch=0"]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "(--set sampler.num_prefetch=0): `sampler.num_prefetch`: got 0" in err, err
    assert err.count("num_prefetch`") == 1, err


def test_a_sampler_rejection_is_explained_under_its_key_once(tpch: Tpch) -> None:
    """The sampler's own ``ConfigError`` (its `key` and `what`), put under the
    key the config set it with: not again as "config `key`"."""
    from headwater import _native

    cfg = load_config(None, **{"database.path": str(tpch.built.path)})
    kw = {**cfg.sampler_kwargs(0), "pool_fraction": 0.0}
    with pytest.raises(_native.ConfigError) as e:
        _native.Sampler(tpch.built.path, **kw)
    # (The config checks the range itself first; any key set there will do.)
    cfg = load_config(None, **{"sampler.pool_fraction": 0.5})
    msg = cfg.explain_sampler_error(e.value, 0)
    assert msg.endswith("`sampler.pool_fraction`: got 0.0, allowed: a number in (0, 1]"), msg
    assert "config `" not in msg, msg
