"""Training checkpoints and ``headwater train --resume RUN_DIR``.

Owns: :class:`Checkpointer` (orbax-checkpoint's ``CheckpointManager`` under
``<run>/checkpoints/<step>/``: ``state`` = params + optimiser state, ``meta``
= JSON), the run's launch record (``launch.json``: the config source and overrides,
so ``--resume RUN_DIR`` needs nothing else), the resume checks
(:func:`check_resume`), ``metrics.jsonl`` truncation and the W&B resume
filter (:class:`ResumedRun`). The launch record also keeps the run's shape
(``num_processes``, ``devices``): ``--resume`` keeps the process count
unless ``--reshard`` is given, and ``resume.sh`` beside it holds the command.

A checkpoint at step ``k`` means steps ``0 .. k-1`` are done: ``state`` holds
the parameters and optimiser state after them and ``meta`` holds ``step =
k``, the sampler state (``sampler.state_dict()``, as of delivery), the W&B
run id, the run's config (``TrainConfig.to_dict()``), the world size and the
RNG: the trainer has no RNG of its own besides ``train.seed`` (parameter
init); every stream RNG is inside the sampler state.

The sampler state is saved **once** (rank 0's, in ``meta``): with global
pools it is the same on every rank (``tests/python/test_resume.py``), and on
resume every rank loads it into its own sampler, whatever the new world
size. A ``[ranks.N]`` table that changes a stream key gives rank N another
state; its restore is then refused by the sampler (``StateError`` naming the
key), which is the right answer for a diagnostic config.

Atomic: orbax writes ``<step>.orbax-checkpoint-tmp-*`` and renames it when
every item is written (its commit protocol); a run killed mid-save leaves a
temporary directory that is ignored and removed on the next start. The save
is asynchronous: the step loop waits only for the device → host copy, the
files are written by orbax's background thread while training continues
(``wait`` before the next save and at the end). The oldest checkpoints beyond
``train.keep_checkpoints`` are deleted by orbax after a save commits.

Stopping on a signal: every rank ORs its stop flag into the per-step shape
agreement (:class:`~headwater.evaluation.padder.Padder`), so all ranks stop after
the same step, save the same checkpoint and write their summaries. The
launcher forwards SIGTERM/SIGINT to its workers.

The last checkpoint (``k = train.steps``) is taken before the final
validation and evaluation and its meta says ``final_phase = "pending"``; the
lead rank writes ``final_phase.json`` when they have ended. A stop during
them (agreed by the ranks like a step's, at the same batch) exits with that
checkpoint, and ``--resume`` reruns only them, from the same sampler state.

Resume: ``metrics.jsonl`` rows of steps ``>= k`` are dropped (they will be
written again); W&B resumes the same run id (``resume="allow"``; offline: a
new ``.wandb`` file of the same run) and rows the previous attempts already
logged (read back from their ``.wandb`` files) are not logged again, so each
step appears once. At the same world size the steps after ``k`` are
bit-identical to the lost ones; at another world size the batches differ and
W&B keeps the first-logged values of steps between ``k`` and the crash.

Must never: report a checkpoint that is not committed, resume from a
checkpoint of another database or an incompatible config without an error
naming the difference, or let ranks stop at different steps.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from headwater.errors import ConfigError

CHECKPOINTS = "checkpoints"
LAUNCH_RECORD = "launch.json"
#: Written by the lead rank when the final validation and evaluation end.
FINAL_PHASE_DONE = "final_phase.json"
#: ``[train]`` keys a resume must keep (the rest of ``[train]`` may change).
TRAIN_KEYS_KEPT = ("seed",)
#: Config sections a resume must keep whole (the parameters' shapes and the
#: optimiser's state and schedule depend on them).
SECTIONS_KEPT = ("model", "optim")


# ----------------------------------------------------------------------------
# The launch record and the resume checks (launcher side, no JAX)
# ----------------------------------------------------------------------------


def write_launch_record(
    run_dir: Path, config: Any, overrides: Mapping[str, Any], world: int = 1
) -> None:
    """``launch.json``: what ``--resume`` reloads (the config file or mapping
    and the overrides of the first start) and the run's shape: its process
    count (``num_processes``, which ``--resume`` keeps unless ``--reshard``
    says otherwise) and, once rank 0 has built its mesh, its ``devices``
    (:func:`record_shape`). A ``resume.sh`` beside it holds the command that
    continues the run (so ``ls runs/<name>`` shows how)."""
    source = config if isinstance(config, Mapping) or config is None else str(Path(config).resolve())
    record = {"config": source, "overrides": dict(overrides), "num_processes": world}
    _write_json(run_dir / LAUNCH_RECORD, record)
    write_resume_script(run_dir, world)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    tmp.replace(path)


#: The script beside ``launch.json`` that continues the run.
RESUME_SCRIPT = "resume.sh"


def write_resume_script(run_dir: Path, world: int) -> None:
    """``<run>/resume.sh``: ``headwater train --resume <run>`` (extra flags
    are passed on), rewritten when a reshard changes the process count."""
    path = run_dir / RESUME_SCRIPT
    path.write_text(
        "#!/bin/sh\n# Continue this run from its last checkpoint (written by headwater train).\n"
        f'exec {resume_command(run_dir, world)} "$@"\n',
        encoding="utf-8",
    )
    path.chmod(0o755)


def record_shape(
    run_dir: Path, world: int, devices: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """Update ``launch.json``'s process count (a resume with ``--reshard``)
    and, when given, its ``devices`` (how the global batch was formed);
    returns the ``devices`` recorded before (None: none were)."""
    path = run_dir / LAUNCH_RECORD
    rec = json.loads(path.read_text(encoding="utf-8"))
    before = rec.get("devices")
    rec["num_processes"] = world
    if devices is not None:
        rec["devices"] = dict(devices)
    _write_json(path, rec)
    write_resume_script(run_dir, world)
    return before


def recorded_world(run_dir: Path) -> int | None:
    """The process count of the run's last checkpoint (its meta's
    ``world``), else ``launch.json``'s; None when neither says."""
    steps = committed_steps(run_dir)
    if steps:
        try:
            return int(read_meta(run_dir, steps[-1])["world"])
        except (ConfigError, KeyError, TypeError, ValueError, OSError):
            pass
    try:
        rec = json.loads((run_dir / LAUNCH_RECORD).read_text(encoding="utf-8"))
        return int(rec["num_processes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def set_aside_stale_ranks(run_dir: Path, world: int) -> list[str]:
    """Move ``rank-<r>.json`` / ``rank-<r>.log`` of ranks ``>= world`` (left
    by an attempt on more processes) to ``<run>/stale-ranks/``; the names moved."""
    moved = []
    for p in sorted(run_dir.glob("rank-*.*")):
        r = p.stem.removeprefix("rank-")
        if p.suffix in (".json", ".log") and r.isdigit() and int(r) >= world:
            dest = run_dir / STALE_RANKS
            dest.mkdir(exist_ok=True)
            p.replace(dest / p.name)
            moved.append(p.name)
    return moved


#: Where the summaries and logs of ranks a reshard removed are moved.
STALE_RANKS = "stale-ranks"


def read_launch_record(run_dir: Path, command: str = "--resume") -> tuple[Any, dict[str, Any]]:
    path = run_dir / LAUNCH_RECORD
    if not path.is_file():
        raise ConfigError(
            f"{command} {run_dir}: not a headwater train run directory (no {LAUNCH_RECORD})"
        )
    rec = json.loads(path.read_text(encoding="utf-8"))
    return rec["config"], dict(rec["overrides"])


def committed_steps(run_dir: Path) -> list[int]:
    """Steps of the committed checkpoints (orbax renames a finished one to
    its step number; temporary directories are not steps)."""
    d = run_dir / CHECKPOINTS
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())


def read_meta(run_dir: Path, step: int) -> dict[str, Any]:
    """The ``meta`` item of checkpoint ``step`` (orbax's JSON handler file)."""
    item = run_dir / CHECKPOINTS / str(step) / "meta"
    files = [p for p in item.iterdir() if p.is_file()] if item.is_dir() else []
    if not files:
        raise ConfigError(f"checkpoint {item.parent}: no meta item (not a headwater checkpoint)")
    meta: dict[str, Any] = json.loads(files[0].read_text(encoding="utf-8"))
    return meta


def final_phase_pending(run_dir: Path, meta: Mapping[str, Any]) -> bool:
    """Whether checkpoint ``meta`` was taken before a final validation and
    evaluation that have not ended (a stop or a crash during them)."""
    if meta.get("final_phase") != "pending":
        return False
    done = run_dir / FINAL_PHASE_DONE
    try:
        return int(json.loads(done.read_text(encoding="utf-8"))["step"]) != int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return True


def mark_final_phase_done(run_dir: Path, step: int) -> None:
    """Record that the final validation and evaluation after ``step`` ended."""
    tmp = run_dir / (FINAL_PHASE_DONE + ".tmp")
    tmp.write_text(json.dumps({"step": step}) + "\n", encoding="utf-8")
    tmp.replace(run_dir / FINAL_PHASE_DONE)


def _flat(d: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {f"{prefix}.{k}": v for k, v in d.items()}


def section_defaults(cfg: Any, sections: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each of ``sections``' keys with its default (as saved: JSON values),
    from ``cfg``'s section dataclasses."""
    out: dict[str, dict[str, Any]] = {}
    for section in sections:
        obj = getattr(cfg, section, None)
        if not dataclasses.is_dataclass(obj):
            continue
        d: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                d[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                d[f.name] = f.default_factory()
        out[section] = json.loads(json.dumps(d, default=str))
    return out


def config_differences(
    saved: Mapping[str, Any],
    now: Mapping[str, Any],
    sections: tuple[str, ...] = SECTIONS_KEPT,
    train_keys: tuple[str, ...] = TRAIN_KEYS_KEPT,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[str]:
    """``section.key: saved → now`` for every key of ``sections`` and of
    ``[train]``'s ``train_keys`` (by default: every key a resume must keep).
    A key the checkpoint does not have (added to headwater after it was
    written) is read as its default from ``defaults`` (:func:`section_defaults`),
    so a checkpoint of an older version resumes unless the key was set."""
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for section in sections:
        missing = {k: v for k, v in (defaults or {}).get(section, {}).items()
                   if k not in saved[section]}
        old.update(_flat({**missing, **saved[section]}, section))
        new.update(_flat(now[section], section))
    for key in train_keys:
        old[f"train.{key}"], new[f"train.{key}"] = saved["train"][key], now["train"][key]
    return [
        f"`{k}`: {old.get(k)!r} in the checkpoint, {new.get(k)!r} now"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]


def check_resume(cfg: Any, db: Path, run_dir: Path) -> int:
    """The step to resume ``run_dir`` from; a :class:`ConfigError` naming what
    differs if the checkpoint does not fit ``cfg`` and ``db``.

    The model, optimiser and ``train.seed`` are compared here; the database
    (content hash) and the sampler's stream keys are checked by the sampler
    itself, by opening one with the saved state.
    """
    from headwater.errors import StateError
    from headwater.mixture import open_sampler

    steps = committed_steps(run_dir)
    if not steps:
        raise ConfigError(f"--resume {run_dir}: no committed checkpoint under {CHECKPOINTS}/")
    step = steps[-1]
    meta = read_meta(run_dir, step)
    now = json.loads(json.dumps(cfg.to_dict()))  # as saved: tuples are lists
    if step > cfg.train.steps or (
        step == cfg.train.steps and not final_phase_pending(run_dir, meta)
    ):
        raise ConfigError(
            f"--resume {run_dir}: checkpoint {step} is already at train.steps = "
            f"{cfg.train.steps}: nothing to resume"
        )
    diffs = config_differences(
        meta["config"], now, defaults=section_defaults(cfg, SECTIONS_KEPT)
    )
    if diffs:
        raise ConfigError(
            f"--resume {run_dir}: checkpoint {step} was written under another config: "
            + "; ".join(diffs)
        )
    kw = cfg.sampler_kwargs(0)
    kw.update(num_prefetch=1, num_threads=1, telemetry=False)
    try:
        # Checked, not restored: the trainer's own sampler logs the resume
        # (once) and the reshard (only when the world size changes).
        with open_sampler(db, rank=0, world_size=1, **kw) as s:
            s.check_state_dict(meta["sampler"])
    except StateError as e:
        raise ConfigError(
            f"--resume {run_dir}: checkpoint {step} does not fit this database or "
            f"[sampler] config: {e}"
        ) from None
    return step


def resume_command(run_dir: Path, world: int) -> str:
    """The exact command that continues ``run_dir``."""
    extra = f" --num-processes {world}" if world > 1 else ""
    return f"headwater train --resume {run_dir}{extra}"


# ----------------------------------------------------------------------------
# Orbax
# ----------------------------------------------------------------------------


def last_committed(run_dir: Path, world: int, joined: bool) -> tuple[int | None, str | None]:
    """The last committed checkpoint of ``run_dir`` and the command that
    resumes from it, ``(None, None)`` when none is committed: what a rank
    that lost a peer reports. ``joined``: a process of a job a cluster
    launcher started, resumed with the job's own flags on every process."""
    steps = committed_steps(run_dir)
    if not steps:
        return None, None
    if joined:
        return steps[-1], (
            f"headwater train --resume {run_dir} (on every process, with this job's "
            "--coordinator, --num-processes and --process-id)"
        )
    return steps[-1], resume_command(run_dir, world)


class Checkpointer:
    """Async, atomic checkpoints of one run (every rank holds one; orbax
    synchronises them and writes each replicated array and the JSON once)."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        import orbax.checkpoint as ocp

        self.ocp = ocp
        self.dir = run_dir / CHECKPOINTS
        self.manager = ocp.CheckpointManager(
            self.dir,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,
            ),
            item_names=("state", "meta"),
        )
        #: Per save: its step and the seconds the step loop was blocked (in
        #: ``save``: waiting for the previous save's commit, if still
        #: running, then orbax's synchronous part); the wait at the end.
        self.steps: list[int] = []
        self.blocked: list[float] = []
        self.final_wait = 0.0

    def save(self, step: int, params: Any, opt_state: Any, meta: Mapping[str, Any]) -> None:
        """Start saving checkpoint ``step`` (waits for the previous save first)."""
        ocp = self.ocp
        t0 = time.perf_counter()
        self.wait()
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
                meta=ocp.args.JsonSave(dict(meta)),
            ),
            force=True,
        )
        self.blocked.append(time.perf_counter() - t0)
        self.steps.append(step)

    def wait(self) -> None:
        """Block until the save in flight is committed."""
        self.manager.wait_until_finished()

    def restore(self, step: int, params: Any, opt_state: Any) -> tuple[Any, Any, dict[str, Any]]:
        """Params, optimiser state (shaped and sharded like the given ones)
        and meta of checkpoint ``step``."""
        import jax

        ocp = self.ocp
        target = jax.tree_util.tree_map(
            ocp.utils.to_shape_dtype_struct, {"params": params, "opt_state": opt_state}
        )
        got = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
            ),
        )
        state = got["state"]
        return state["params"], state["opt_state"], dict(got["meta"])

    def close(self) -> None:
        t0 = time.perf_counter()
        self.wait()
        self.final_wait = time.perf_counter() - t0
        self.manager.close()

    def figures(self) -> dict[str, Any]:
        """Save timings for the summary (how long the loop was stalled)."""
        return {
            "steps": self.steps,
            "blocked_seconds": self.blocked,
            "final_wait_seconds": self.final_wait,
        }


def restore_params(run_dir: Path, step: int, params: Any, opt_state: Any) -> Any:
    """The parameters of checkpoint ``step`` (shaped like ``params``; the
    whole ``state`` item is read, ``opt_state`` gives the optimiser part's
    shapes). Read-only: no :class:`Checkpointer` (whose manager cleans up
    temporary directories, a save in flight among them) is opened."""
    import jax
    import orbax.checkpoint as ocp

    target = jax.tree_util.tree_map(
        ocp.utils.to_shape_dtype_struct, {"params": params, "opt_state": opt_state}
    )
    item = (run_dir / CHECKPOINTS / str(step) / "state").resolve()
    with ocp.StandardCheckpointer() as ckptr:
        got = ckptr.restore(item, target)
    return got["params"]


# ----------------------------------------------------------------------------
# metrics.jsonl and W&B on resume
# ----------------------------------------------------------------------------


def truncate_jsonl(path: Path, step: int, final_phase: bool = False) -> None:
    """Drop the rows of steps ``>= step`` (and a torn last line) from ``path``;
    ``final_phase``: also the validation and evaluation rows logged at
    ``step - 1`` (an interrupted final phase's, which the resume reruns)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break  # the last line of a killed run
        at = row.get("step", step)
        if final_phase and at == step - 1 and _row_kind(row.keys()) not in _STEP_KINDS:
            continue
        if at < step:
            keep.append(line + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(keep), encoding="utf-8")
    tmp.replace(path)


def _wandb_records(data: bytes) -> Iterator[bytes]:
    """The records of a ``.wandb`` file (a LevelDB-style log of 32 KiB
    blocks, see ``tests/python/read_wandb.py``); stops at a torn tail."""
    block, pos, parts = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        payload = data[pos + 7 : pos + 7 + length]
        if len(payload) < length or zlib.crc32(bytes([kind]) + payload) & 0xFFFFFFFF != crc:
            return
        pos += 7 + length
        parts = payload if kind in (1, 2) else parts + payload
        if kind in (1, 4):
            yield parts


#: Row kinds a training step logs (the others come from validation and
#: evaluation passes).
_STEP_KINDS = ("trainer", "telemetry")


def _row_kind(keys: Any) -> str:
    """``val``, ``trainer``, ``eval/<split>`` or ``telemetry``: rows of one kind
    are logged once per step at most, in step order."""
    keys = set(keys)
    if "val/loss" in keys:
        return "val"
    if "trainer/loss" in keys:
        return "trainer"
    split = next(
        (k.split("/")[1] for k in keys if k.startswith("eval/") and k.count("/") > 1), None
    )
    return f"eval/{split}" if split else "telemetry"


def logged_steps(run_dir: Path, run_id: str) -> dict[str, int]:
    """Per row kind (trainer, val, telemetry), the last ``trainer/step`` the
    earlier attempts of W&B run ``run_id`` wrote to their ``.wandb`` files."""
    from wandb.proto import wandb_internal_pb2 as pb

    last: dict[str, int] = {}
    for f in sorted((run_dir / "wandb").glob(f"*-{run_id}/run-{run_id}.wandb")):
        for raw in _wandb_records(f.read_bytes()):
            rec = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") != "history":
                continue
            row = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
            if "trainer/step" in row:
                kind, step = _row_kind(row), int(json.loads(row["trainer/step"]))
                last[kind] = max(last.get(kind, -1), step)
    return last


class ResumedRun:
    """A W&B run that drops rows an earlier attempt already logged."""

    def __init__(self, run: Any, logged: Mapping[str, int]) -> None:
        self.run, self.logged = run, dict(logged)

    def log(self, row: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        step = row.get("trainer/step")
        if step is not None and step <= self.logged.get(_row_kind(row.keys()), -1):
            return
        self.run.log(row, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)
