"""Training checkpoints and ``headwater train --resume``: real runs.

Every run is the real command in a subprocess (two processes on one
loopback ``jax.distributed`` job) on the session's TPC-H database, with the
tiny model of ``test_train.py``:

* a run killed with SIGKILL (the whole process group, W&B's writer
  included) at a step after a checkpoint and resumed ends with the same
  parameters (digest) as an uninterrupted run of the same length; the
  combined W&B offline files and ``metrics.jsonl`` hold each step once, with
  the uninterrupted run's losses (no seam);
* SIGTERM to the launcher: both ranks stop after the same step, checkpoint
  it, write their summaries, and the exact resume command is printed; that
  command continues on another number of processes, is stopped again during
  the final evaluation (the last checkpoint precedes it), and resumed once
  more reruns only the final passes (once each in ``metrics.jsonl``);
* a resume under a changed stream key or model key, or a new run into a
  directory with checkpoints, is refused naming what differs.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import READ_WANDB, Tpch, child_env, tiny_train_config

pytest.importorskip("jax")
pytest.importorskip("optax")
pytest.importorskip("wandb")
pytest.importorskip("orbax.checkpoint")

STEPS = 12
EVERY = 4


def config(db: Path, steps: int = STEPS, every: int = EVERY, final: bool = True) -> str:
    """``final = False``: no final evaluation passes (the final validation
    batch stays), for a test that checks neither."""
    train = f"val_every = 5\ncheckpoint_every = {every}\neval_final = {str(final).lower()}"
    return tiny_train_config(db, steps, train=train)


def command(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "headwater.cli", "train", *args]


def run(tmp_path: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(tmp_path, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(tmp_path),
        check=False,
    )


def start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(tmp_path, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(tmp_path),
        start_new_session=True,
    )


def rows(run_dir: Path, key: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if key in r]


def trainer_steps_logged(run_dir: Path) -> int:
    """The last step with a trainer row in ``metrics.jsonl`` (-1: none yet)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return -1
    steps = [-1]
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            break
        if "trainer/loss" in r:
            steps.append(r["step"])
    return max(steps)


def committed(run_dir: Path) -> list[int]:
    d = run_dir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def wait_until(proc: subprocess.Popen[str], cond: Any, what: str, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the run ended (status {proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def wandb_history(tmp_path: Path, run_dir: Path) -> tuple[list[dict[str, Any]], set[str]]:
    """Every history row of every ``.wandb`` file of the run (file order)."""
    files = sorted(f for f in run_dir.glob("wandb/*/run-*.wandb") if not f.parent.is_symlink())
    hist: list[dict[str, Any]] = []
    for f in files:
        read = subprocess.run(
            [sys.executable, str(READ_WANDB), str(f)],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(tmp_path),
            check=False,
        )
        assert read.returncode == 0, read.stderr[-3000:]
        hist += json.loads(read.stdout)["history"]
    return hist, {f.name for f in files}


def summaries(run_dir: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((run_dir / f"rank-{r}.json").read_text()) for r in range(world)]


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path: Path, tpch: Tpch) -> None:
    # Without the final evaluation: its passes (a compile and ~300 batches in
    # each of the two finished runs) check nothing here; the SIGTERM and
    # Ctrl-C tests resume into and through it.
    cfg = tmp_path / "train.toml"
    cfg.write_text(config(tpch.built.path, final=False), encoding="utf-8")
    runs = tmp_path / "runs"
    common = (str(cfg), "--dir", str(runs), "--num-processes", "2")

    full = run(tmp_path, *common, "--run-name", "full")
    assert full.returncode == 0, full.stderr[-4000:]
    want = summaries(runs / "full", 2)
    assert want[0]["param_digest"] == want[1]["param_digest"]
    assert want[0]["checkpoint"]["steps"] == [4, 8, STEPS]

    # Kill (SIGKILL, every process of the run) once the first checkpoint is
    # committed and a later step is logged.
    killed = runs / "killed"
    kill_after = random.randint(EVERY + 1, 2 * EVERY - 1)
    proc = start(tmp_path, *common, "--run-name", "killed")
    wait_until(
        proc,
        lambda: committed(killed) and trainer_steps_logged(killed) >= kill_after,
        f"checkpoint {EVERY} and step {kill_after}",
    )
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    lost_from = committed(killed)[-1]
    logged = trainer_steps_logged(killed)
    assert lost_from < logged + 1 < STEPS, (lost_from, logged)
    assert not (killed / "rank-0.json").exists()

    # A plain --resume keeps the run's two processes (recorded): no reshard,
    # and the sampler's resume is logged once (rank 0's; rank 1's is in its log).
    r = run(tmp_path, "--resume", str(killed))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    both = r.stdout + r.stderr
    assert "reshard" not in both and both.count("resumed from a saved sampler state") == 1, both
    assert json.loads((killed / "launch.json").read_text())["num_processes"] == 2
    got = summaries(killed, 2)
    assert [s["start_step"] for s in got] == [lost_from, lost_from]
    assert got[0]["steps"] == STEPS - lost_from
    # The same parameters as the uninterrupted run, bit for bit.
    assert got[0]["param_digest"] == got[1]["param_digest"] == want[0]["param_digest"]

    # metrics.jsonl: each step once, the uninterrupted run's losses.
    tr = rows(killed, "trainer/loss")
    assert [x["step"] for x in tr] == list(range(STEPS)), f"killed after {logged}"
    assert [x["trainer/loss"] for x in tr] == pytest.approx(want[0]["losses"], rel=1e-6)
    assert [x["step"] for x in rows(killed, "val/loss")] == [4, 9, STEPS - 1]
    assert [x["step"] for x in rows(killed, "sampler/batches")] == list(range(STEPS))

    # W&B: one run (same id, two offline files), each step once, no seam.
    hist, files = wandb_history(tmp_path, killed)
    assert len(files) == 1 and len(list(killed.glob("wandb/offline-run-*"))) == 2, files
    trainer = [h for h in hist if "trainer/loss" in h]
    assert sorted(h["trainer/step"] for h in trainer) == list(range(STEPS))
    by_step = {h["trainer/step"]: h["trainer/loss"] for h in trainer}
    assert [by_step[s] for s in range(STEPS)] == pytest.approx(want[0]["losses"], rel=1e-6)
    tele = sorted(h["trainer/step"] for h in hist if "sampler/batches" in h)
    assert tele == list(range(STEPS))
    assert sorted(h["trainer/step"] for h in hist if "val/loss" in h) == [4, 9, STEPS - 1]


def test_sigterm_checkpoints_summarises_and_says_how_to_resume(
    tmp_path: Path, tpch: Tpch
) -> None:
    steps = 40
    cfg = tmp_path / "train.toml"
    cfg.write_text(config(tpch.built.path, steps=steps, every=0), encoding="utf-8")
    runs = tmp_path / "runs"
    run_dir = runs / "term"
    proc = start(tmp_path, str(cfg), "--dir", str(runs), "--num-processes", "2", "--run-name", "term")
    wait_until(proc, lambda: trainer_steps_logged(run_dir) >= 1, "step 1")
    proc.send_signal(signal.SIGTERM)  # the launcher only: it forwards to the ranks
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]
    assert "SIGTERM received: stopping after the current step" in err, err[-3000:]

    s0, s1 = summaries(run_dir, 2)
    done = s0["steps"]
    assert 2 <= done < steps
    assert (s0["interrupted"], s1["interrupted"], s1["steps"]) == ("SIGTERM", "SIGTERM", done)
    assert s0["param_digest"] == s1["param_digest"]
    assert committed(run_dir) == [done] and s0["checkpoint"]["steps"] == [done]
    hint = f"headwater train --resume {run_dir} --num-processes 2"
    assert f"after step {done}" in err and hint in err, err[-2000:]
    assert trainer_steps_logged(run_dir) == done - 1

    # Refusals, before any training: a stream key, a model key, a new run
    # over the checkpoints.
    bad = run(tmp_path, "--resume", str(run_dir), "--set", "sampler.seed=5")
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "`seed`" in bad.stderr and f"checkpoint {done}" in bad.stderr, bad.stderr[-3000:]
    bad = run(tmp_path, "--resume", str(run_dir), "--set", "model.d_model=64")
    assert bad.returncode == 2 and "`model.d_model`: 32 in the checkpoint, 64 now" in bad.stderr
    bad = run(tmp_path, str(cfg), "--dir", str(runs), "--run-name", "term")
    assert bad.returncode == 2 and "already holds checkpoints" in bad.stderr, bad.stderr[-3000:]

    # One process instead of two needs --reshard (the global batch halves,
    # the run is no longer bit-identical): without it, a refusal that says so.
    bad = run(tmp_path, *hint.split()[2:-2], "--num-processes", "1")
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "trained on 2 process(es), this start has 1" in bad.stderr and "--reshard" in bad.stderr

    # The printed command with --reshard, on one process (the sampler
    # continues the global cursors; parameters are replicated), stopped
    # again during the final evaluation: the last checkpoint is committed
    # before it starts, and the stop does not wait for its passes.
    proc = start(tmp_path, *hint.split()[2:-2], "--num-processes", "1", "--reshard")
    wait_until(proc, lambda: committed(run_dir)[-1:] == [steps], f"checkpoint {steps}")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]
    assert "stopping during the final evaluation: SIGTERM" in out, out[-3000:]
    assert "reshard: world size 2 -> 1: the global batch goes from 8 to 4" in out, out[:3000]
    assert (run_dir / "stale-ranks" / "rank-1.json").is_file()
    assert not (run_dir / "rank-1.json").exists() and not (run_dir / "rank-1.log").exists()
    assert json.loads((run_dir / "launch.json").read_text())["num_processes"] == 1
    assert f"after step {steps}, before the final evaluation ended" in err, err[-3000:]
    (s,) = summaries(run_dir, 1)
    assert (s["start_step"], s["steps"], s["world"], s["interrupted"]) == (
        done,
        steps - done,
        1,
        "SIGTERM",
    )
    assert [x["step"] for x in rows(run_dir, "trainer/loss")] == list(range(steps))
    assert not (run_dir / "final_phase.json").exists()
    # The final validation (one batch) may have ended before the stop.
    stopped_val = [x["val/loss"] for x in rows(run_dir, "val/loss") if x["step"] == steps - 1]

    # The resume (on the one process the run now records) reruns the final
    # validation and evaluation alone, and its summary prints no NaN.
    r = run(tmp_path, *hint.split()[2:-2])
    assert r.returncode == 0, r.stderr[-4000:]
    assert "reshard" not in r.stdout + r.stderr
    assert "done: no training steps in this attempt" in r.stdout, r.stdout[-3000:]
    assert "nan" not in r.stdout.lower() and "Mean of empty slice" not in r.stderr
    (s,) = summaries(run_dir, 1)
    assert (s["start_step"], s["steps"], s["interrupted"]) == (steps, 0, None)
    assert committed(run_dir)[-1] == steps
    assert [x["step"] for x in rows(run_dir, "trainer/loss")] == list(range(steps))
    assert [x["step"] for x in rows(run_dir, "val/loss")] == [4, 9, 14, 19, 24, 29, 34, steps - 1]
    # Rerun from the same sampler state: the same validation batch and loss.
    assert stopped_val in ([], [s["final_val_loss"]]), (stopped_val, s["final_val_loss"])
    for split in ("val", "test"):
        (row,) = rows(run_dir, f"eval/{split}/order_status/accuracy")
        assert row["step"] == steps - 1
        assert row[f"eval/{split}/order_status/accuracy"] == pytest.approx(
            s["eval"][split]["order_status"]["metrics"]["accuracy"]
        )
    # A run whose final phase ended has nothing left to resume.
    again = run(tmp_path, *hint.split()[2:-2])
    assert again.returncode == 2 and "nothing to resume" in again.stderr, again.stderr[-3000:]


class Lines:
    """A started run's stdout and stderr lines, each with the time it arrived."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import threading

        self.proc, self.t0, self.lines = proc, time.monotonic(), []  # type: ignore[var-annotated]
        self.threads = [
            threading.Thread(target=self._read, args=(f,), daemon=True)
            for f in (proc.stdout, proc.stderr)
        ]
        for t in self.threads:
            t.start()

    def _read(self, f: Any) -> None:
        for line in f:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, text: str, timeout: float = 400) -> float:
        """When the first line holding ``text`` arrived (waits for it)."""
        deadline = time.monotonic() + timeout
        while True:
            hit = [t for t, ln in list(self.lines) if text in ln]
            if hit:
                return hit[0]
            if self.proc.poll() is not None and all(not t.is_alive() for t in self.threads):
                pytest.fail(f"the run ended before {text!r}:\n" + self.text()[-3000:])
            if time.monotonic() > deadline:
                os.killpg(self.proc.pid, signal.SIGKILL)
                pytest.fail(f"timed out waiting for {text!r}")
            time.sleep(0.01)

    def finish(self, timeout: float = 300) -> int:
        rc = self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=10)
        return rc

    def text(self) -> str:
        return "\n".join(ln for _, ln in sorted(self.lines))


def test_ctrl_c_is_acknowledged_at_once_and_the_printed_command_resumes(
    tmp_path: Path, tpch: Tpch
) -> None:
    """One process: start-up says what it does and prints the resume command
    first; SIGINT mid-training is acknowledged within a second or two, the
    run stops after the step with a checkpoint; the progress loss is each
    step's own (log_every = 1: the window is the step). The printed command
    resumes it: the restored checkpoint is named, the sampler's resume line
    printed once and no reshard line (same world size); the final
    evaluation shows progress at once, and the summary keeps training and
    evaluation time apart."""
    # Each batch takes >= 40 ms: the signal (after step 3) comes >= 2 s before
    # the end. 60 steps, as test_train's one-process run: the same compiled
    # train step, which that run then loads from the session's cache.
    steps = 60
    cfg = tmp_path / "train.toml"
    cfg.write_text(
        tiny_train_config(tpch.built.path, steps, train="val_every = 0\ncheckpoint_every = 0")
        .replace("num_threads = 1", "num_threads = 1\ndebug_batch_delay_ms = 40.0"),
        encoding="utf-8",
    )
    runs = tmp_path / "runs"
    run_dir = runs / "ctrlc"
    out = Lines(start(tmp_path, str(cfg), "--dir", str(runs), "--run-name", "ctrlc"))
    resume_line = f"resume with: headwater train --resume {run_dir}"
    started = out.first(resume_line)
    assert (run_dir / "resume.sh").read_text().count(f"headwater train --resume {run_dir}") == 1
    compiling = out.first("start-up: compiling the train step")
    out.first("step     3/")
    sent = time.monotonic()
    os.kill(out.proc.pid, signal.SIGINT)
    acked = out.first("SIGINT received: stopping after the current step")
    assert out.finish() == 128 + signal.SIGINT, out.text()[-3000:]
    latency = acked - sent
    print(f"\nSIGINT acknowledged after {latency * 1e3:.1f} ms; resume command {started - out.t0:.1f} s "
          f"and the compile line {compiling - out.t0:.1f} s after the start")
    assert latency < 2.0, latency
    text = out.text()
    (s,) = summaries(run_dir, 1)
    done = s["steps"]
    assert f"stopping after step {done}: SIGINT" in text and committed(run_dir) == [done]
    assert f"done: {done} steps in " in text and " s training + " in text
    assert "nan" not in text.split("done:")[1].split("W&B")[0].lower(), text[-2000:]
    shown = [float(m) for m in re.findall(r"step +\d+/\d+ +loss +([\d.]+)", text)]
    logged = [x["trainer/loss"] for x in rows(run_dir, "trainer/loss")]
    assert shown == pytest.approx(logged, abs=1e-4)

    # The printed command: the remaining steps and the final evaluation.
    r = Lines(start(tmp_path, *resume_line.split(": ", 1)[1].split()[2:]))
    began = r.first("final validation:")
    first_bar = r.first("final eval val: 0/")
    assert r.finish() == 0, r.text()[-3000:]
    text = r.text()
    print(f"final evaluation progress shown {1e3 * (first_bar - began):.0f} ms after it began")
    assert text.count("resumed from a saved sampler state") == 1, text[:3000]
    assert "reshard" not in text
    assert f"restored the parameters and optimiser state of checkpoint {done}" in text
    assert re.search(r"final eval test: (\d+)/\1 batches \(100%\)", text), text[-3000:]
    assert f"done: {steps - done} steps in " in text and "nan" not in text.lower()
    (s,) = summaries(run_dir, 1)
    assert s["eval_seconds"] > 0 and s["train_seconds"] + s["eval_seconds"] == pytest.approx(
        s["wall_seconds"]
    )


def test_a_signal_during_start_up_stops_it_at_once(tmp_path: Path, tpch: Tpch) -> None:
    """SIGINT before the first step: no step to finish, nothing to save; the
    run says so and exits within seconds (it waited for the compilation and
    a step before)."""
    cfg = tmp_path / "train.toml"
    cfg.write_text(tiny_train_config(tpch.built.path, 50), encoding="utf-8")
    runs = tmp_path / "runs"
    out = Lines(start(tmp_path, str(cfg), "--dir", str(runs), "--run-name", "early"))
    out.first("headwater train: db")  # the sampler is open, the model not compiled
    sent = time.monotonic()
    os.kill(out.proc.pid, signal.SIGINT)
    rc = out.finish()
    took = time.monotonic() - sent
    text = out.text()
    print(f"\nstart-up stopped {took:.1f} s after SIGINT")
    assert rc == 128 + signal.SIGINT, text[-3000:]
    assert "Traceback" not in text and "stopping after step" not in text, text[-3000:]
    assert "SIGINT" in text and "start-up" in text, text[-3000:]
    assert committed(runs / "early") == []
    assert took < 15, took


def test_a_start_up_signal_whose_exception_python_swallowed_still_stops() -> None:
    """The handler's raise can run inside a callback whose exceptions Python
    only prints (JAX's gc callback during the compilation: seen in CI, the
    run trained on and checkpointed); the loop's recheck raises it again,
    and the installed flag keeps the dropped one from printing a traceback."""
    import gc

    from headwater.cluster.stopping import StartupInterrupted, StopFlag

    quiet = StopFlag(abort_startup=True)
    quiet.recheck_startup()  # no signal: nothing raised
    seen: list[BaseException | None] = []
    before = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        for installed in (False, True):
            flag = StopFlag(abort_startup=True)
            if installed:
                flag.install()

            def callback(phase: str, info: dict[str, int], flag: StopFlag = flag) -> None:
                gc.callbacks.remove(callback)
                flag._handle(signal.SIGINT, None)

            gc.callbacks.append(callback)
            gc.collect()  # the handler's StartupInterrupted is dropped
            flag.restore()
            assert flag.signum == signal.SIGINT
            with pytest.raises(StartupInterrupted):
                flag.recheck_startup()
            flag.training = True
            flag.recheck_startup()  # once training, a signal waits for the step
            # Not installed, Python reports it (a traceback on stderr);
            # installed, the flag's hook keeps it quiet.
            assert [type(e) for e in seen] == [StartupInterrupted], (installed, seen)
        # The hook is put back, and passes on other exceptions.
        assert sys.unraisablehook is not flag._unraisable_hook
        flag = StopFlag(abort_startup=True).install()
        sys.unraisablehook(
            type("U", (), {"exc_value": ValueError("x"), "exc_type": ValueError})()  # type: ignore[arg-type]
        )
        flag.restore()
        assert [type(e) for e in seen] == [StartupInterrupted, ValueError]
    finally:
        sys.unraisablehook = before


def test_a_signal_during_a_two_process_start_up_stops_it_at_once(
    tmp_path: Path, tpch: Tpch
) -> None:
    """The launcher acknowledges the signal, forwards it, and reports the
    stop during start-up (not a failed rank), exiting with 128 + SIGINT."""
    cfg = tmp_path / "train.toml"
    cfg.write_text(tiny_train_config(tpch.built.path, 50), encoding="utf-8")
    runs = tmp_path / "runs"
    out = Lines(start(tmp_path, str(cfg), "--dir", str(runs), "--num-processes", "2"))
    out.first("resume with: headwater train --resume")
    time.sleep(1.0)  # the workers are starting (importing JAX, joining the job)
    sent = time.monotonic()
    os.kill(out.proc.pid, signal.SIGINT)
    acked = out.first("SIGINT received")
    rc = out.finish()
    took = time.monotonic() - sent
    text = out.text()
    print(f"\nacknowledged after {1e3 * (acked - sent):.1f} ms, stopped after {took:.1f} s")
    assert rc == 128 + signal.SIGINT, text[-3000:]
    assert "SIGINT during start-up: stopped before the first step" in text, text[-3000:]
    assert "exited with status" not in text and "Traceback" not in text, text[-3000:]
    assert took < 30, took


def test_the_launch_record_keeps_the_runs_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``launch.json`` records the process count and the devices, and
    ``resume.sh`` the command; a resume on other devices says so, one on
    the same devices does not; ranks beyond a new world size move aside."""
    from headwater.rundir import checkpoint as C
    from headwater.train.rank import _record_devices

    cpu = {
        "processes": 2, "local_devices": 1, "platform": "cpu", "devices": 2,
        "global_batch": 8, "per_device_batch": 4, "per_process_batch": 4,
    }
    C.write_launch_record(tmp_path, {"train": {"steps": 3}}, {}, world=2)
    assert C.recorded_world(tmp_path) == 2
    assert f"headwater train --resume {tmp_path} --num-processes 2" in (
        tmp_path / "resume.sh"
    ).read_text()
    _record_devices(tmp_path, 2, cpu, resume=False)
    _record_devices(tmp_path, 2, cpu, resume=True)
    assert capsys.readouterr().out == ""
    _record_devices(tmp_path, 2, {**cpu, "platform": "gpu"}, resume=True)
    out = capsys.readouterr().out
    assert "other devices than the checkpoint's run" in out and "gpu device(s)" in out, out
    assert json.loads((tmp_path / "launch.json").read_text())["devices"]["platform"] == "gpu"

    for r in range(3):
        (tmp_path / f"rank-{r}.json").write_text("{}")
    (tmp_path / "rank-2.log").write_text("")
    assert C.set_aside_stale_ranks(tmp_path, 2) == ["rank-2.json", "rank-2.log"]
    assert sorted(p.name for p in tmp_path.glob("rank-*")) == ["rank-0.json", "rank-1.json"]
    assert C.set_aside_stale_ranks(tmp_path, 2) == []


def test_a_key_newer_than_the_checkpoint_reads_as_its_default(tmp_path: Path) -> None:
    """A checkpoint written before a ``[model]`` key existed resumes (the
    key reads as its default), unless the run now sets it to another value;
    a key the checkpoint has keeps its strict comparison."""
    pytest.importorskip("jax")
    from headwater.runconfig.config import load_config
    from headwater.rundir import checkpoint as C

    toml = tmp_path / "c.toml"
    toml.write_text('[database]\npath = "db"\n', encoding="utf-8")
    cfg = load_config(toml)
    now = json.loads(json.dumps(cfg.to_dict()))
    saved = json.loads(json.dumps(now))
    del saved["model"]["cat_chunk_mib"]
    defaults = C.section_defaults(cfg, C.SECTIONS_KEPT)
    assert C.config_differences(saved, now, defaults=defaults) == []
    assert C.config_differences(saved, now) != [], "without defaults the absent key differs"
    changed = json.loads(json.dumps(now))
    changed["model"]["cat_chunk_mib"] = 16
    diffs = C.config_differences(saved, changed, defaults=defaults)
    assert len(diffs) == 1 and "model.cat_chunk_mib" in diffs[0], diffs
    changed["model"]["d_model"] = now["model"]["d_model"] * 2
    assert len(C.config_differences(saved, changed, defaults=defaults)) == 2
