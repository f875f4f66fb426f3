"""How a ``headwater train`` process joins its job: alone, as one of N local
processes the launcher starts, or as one process of a multi-host job started
by a cluster launcher.

Owns: :class:`JobSpec` (what was asked, and where each value came from),
:func:`resolve_job` (flags, then ``HEADWATER_*`` environment variables, then
cluster auto-detection), :func:`join_job` (``jax.distributed.initialize``
behind a roll call on the coordinator's port, so an address that never
answers, a duplicate process id or a missing process is an error naming it
within the timeout instead of XLA aborting the process) and :func:`check_same_schema` (every rank must pack the same
telemetry layout and feed the same batch shapes; compared by hash at
start-up, the error names the ranks).

Modes:

* ``single``  -- one process, no ``jax.distributed``;
* ``local``   -- ``--num-processes N`` without a coordinator: the launcher
  starts N processes on this machine (loopback);
* ``explicit`` -- ``--coordinator HOST:PORT --num-processes N --process-id I``
  (or ``HEADWATER_COORDINATOR`` / ``HEADWATER_NUM_PROCESSES`` /
  ``HEADWATER_PROCESS_ID``): this process is rank I of N;
* ``auto``    -- no coordinator given but a cluster launcher's environment
  (SLURM with ``SLURM_NTASKS`` > 1, Open MPI with ``OMPI_COMM_WORLD_SIZE`` >
  1): ``jax.distributed.initialize()`` reads it.

Must never: force a platform (GPUs are used when present), keep the
coordinator's port after the roll call, or hang on a coordinator that does not answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from headwater.errors import ConfigError

ENV_COORDINATOR = "HEADWATER_COORDINATOR"
ENV_NUM_PROCESSES = "HEADWATER_NUM_PROCESSES"
ENV_PROCESS_ID = "HEADWATER_PROCESS_ID"
ENV_TIMEOUT = "HEADWATER_COORDINATOR_TIMEOUT_S"
#: Seconds to wait for the coordinator (and for every process to register).
DEFAULT_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """How this process joins its job; ``origin`` says where each value came from."""

    mode: str  # single | local | explicit | auto
    num_processes: int = 1
    process_id: int | None = None
    coordinator: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    launcher: str | None = None  # auto mode: "SLURM" | "Open MPI"
    origin: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _int(value: Any, name: str, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name} = {value!r} is not an integer") from None


def _pick(flag: Any, flag_name: str, env_name: str, env: Mapping[str, str]) -> tuple[Any, str]:
    if flag is not None:
        return flag, flag_name
    if env.get(env_name, "") != "":
        return env[env_name], f"${env_name}"
    return None, ""


def detect_launcher(env: Mapping[str, str]) -> str | None:
    """The cluster launcher whose environment starts a multi-process job, if any."""
    if env.get("SLURM_JOB_ID") and _count(env.get("SLURM_NTASKS")) > 1:
        return "SLURM"
    if _count(env.get("OMPI_COMM_WORLD_SIZE")) > 1:
        return "Open MPI"
    return None


def _count(v: str | None) -> int:
    try:
        return int(v or 0)
    except ValueError:
        return 0


def resolve_job(
    *,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> JobSpec:
    """The job this process belongs to: flags win over ``HEADWATER_*`` variables,
    which win over a detected cluster launcher."""
    env = os.environ if env is None else env
    coord, c_from = _pick(coordinator, "--coordinator", ENV_COORDINATOR, env)
    n_raw, n_from = _pick(num_processes, "--num-processes", ENV_NUM_PROCESSES, env)
    i_raw, i_from = _pick(process_id, "--process-id", ENV_PROCESS_ID, env)
    t_raw, t_from = _pick(timeout_s, "--coordinator-timeout", ENV_TIMEOUT, env)
    timeout = DEFAULT_TIMEOUT_S
    if t_raw is not None:
        try:
            timeout = float(t_raw)
        except ValueError:
            raise ConfigError(f"{t_from}: timeout = {t_raw!r} is not a number") from None
        if not 0 < timeout <= 3600:
            raise ConfigError(f"{t_from}: timeout = {t_raw!r} must be in (0, 3600] seconds")
    origin = {"coordinator": c_from, "num_processes": n_from, "process_id": i_from}
    n = None if n_raw is None else _int(n_raw, "num_processes", n_from)
    if n is not None and n < 1:
        raise ConfigError(f"{n_from}: num_processes = {n} must be >= 1")
    pid = None if i_raw is None else _int(i_raw, "process_id", i_from)
    if coord is None:
        if pid is not None:
            raise ConfigError(
                f"{i_from}: process_id = {pid} needs a coordinator (--coordinator HOST:PORT or "
                f"${ENV_COORDINATOR}); without one, --num-processes starts every process here"
            )
        launcher = detect_launcher(env)
        if launcher is not None and n is None:
            return JobSpec("auto", timeout_s=timeout, launcher=launcher, origin=origin)
        mode = "local" if (n or 1) > 1 else "single"
        return JobSpec(mode, num_processes=n or 1, timeout_s=timeout, origin=origin)
    return _explicit(str(coord), n, pid, timeout, origin)


def _explicit(
    coord: str, n: int | None, pid: int | None, timeout: float, origin: Mapping[str, str]
) -> JobSpec:
    host, _, port = coord.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{origin['coordinator']}: coordinator = {coord!r} is not HOST:PORT (port 1..65535)"
        )
    if n is None or pid is None:
        missing = "--num-processes" if n is None else "--process-id"
        env_name = ENV_NUM_PROCESSES if n is None else ENV_PROCESS_ID
        raise ConfigError(
            f"{origin['coordinator']}: a coordinator ({coord}) needs {missing} (or ${env_name})"
        )
    if not 0 <= pid < n:
        raise ConfigError(
            f"{origin['process_id']}: process_id = {pid} is outside 0..{n - 1} "
            f"(num_processes = {n} from {origin['num_processes']})"
        )
    return JobSpec("explicit", n, pid, coord, timeout, None, origin)


#: The first line of a roll-call message (see :func:`roll_call`).
ROLL_CALL = "headwater-roll-call 1"


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _read_line(conn: socket.socket, limit: int = 4096) -> str:
    """One ``\n``-terminated line (without it); ``""`` on EOF first."""
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < limit:
        chunk = conn.recv(limit - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf.decode("utf-8", errors="replace").rstrip("\n")


def roll_call(spec: JobSpec) -> None:
    """Check the job's process ids before ``jax.distributed`` sees them.

    Process 0 listens on the coordinator's port (before the coordinator
    service takes it over) until every other id has checked in; each other
    process connects, says ``num_processes``, its id, host and pid, and waits
    for the answer. A duplicate id, a different process count or a missing
    process is refused on every process with a message naming the ids and
    hosts, within ``timeout_s`` -- instead of XLA aborting the processes (two
    processes with the same id otherwise both die in ``RegisterTask``).
    """
    if spec.process_id == 0:
        _call_roll(spec)
    else:
        _answer_roll(spec)


def _me(spec: JobSpec) -> str:
    return f"{spec.process_id} {socket.gethostname()} {os.getpid()}"


def _call_roll(spec: JobSpec) -> None:
    assert spec.coordinator is not None
    host, port = _split_address(spec.coordinator)
    where = spec.origin.get("coordinator", "--coordinator")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    loopback = host in ("127.0.0.1", "localhost", "::1")
    try:
        srv.bind((host if loopback else "", port))
    except OSError as e:
        srv.close()
        raise ConfigError(
            f"{where}: process 0 cannot serve the coordinator {spec.coordinator} ({e}); is "
            "another process started with process id 0 (or another job) using that port?"
        ) from None
    srv.listen(max(spec.num_processes, 8))
    srv.settimeout(0.2)
    deadline = time.monotonic() + spec.timeout_s
    seen: dict[int, str] = {}
    conns: list[socket.socket] = []
    problems: list[str] = []
    try:
        while len(seen) < spec.num_processes - 1 and not problems:
            if time.monotonic() > deadline:
                missing = sorted(set(range(1, spec.num_processes)) - set(seen))
                problems.append(
                    f"process id(s) {missing} did not check in within {spec.timeout_s:g} s "
                    f"(started, with the same coordinator and --num-processes "
                    f"{spec.num_processes}?)"
                )
                break
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(10.0)
            conns.append(conn)
            problem = _check_in(spec, conn, seen)
            if problem:
                problems.append(problem)
        reply = "ok" if not problems else "error " + "; ".join(problems)
        for conn in conns:
            try:
                conn.sendall(reply.encode() + b"\n")
                conn.recv(1)  # the other side closes first (no TIME_WAIT on the port)
            except OSError:
                pass
    finally:
        for conn in conns:
            conn.close()
        srv.close()
    if problems:
        raise ConfigError(f"{where}: the job's processes do not fit: " + "; ".join(problems))


def _check_in(spec: JobSpec, conn: socket.socket, seen: dict[int, str]) -> str | None:
    """Record one process's check-in; what is wrong with it, if anything."""
    try:
        line = _read_line(conn)
    except OSError as e:
        return f"a process connected but sent no roll call ({e})"
    head, _, rest = line.partition(" | ")
    parts = rest.split(" ")
    if head != ROLL_CALL or len(parts) != 4 or not all(p.isdigit() for p in (parts[0], parts[1])):
        return f"something that is not a headwater process connected ({line[:80]!r})"
    n, pid, who = int(parts[0]), int(parts[1]), f"{parts[2]} (pid {parts[3]})"
    if n != spec.num_processes:
        return (
            f"process {pid} on {who} has num_processes = {n}, process 0 has "
            f"{spec.num_processes}"
        )
    if pid == 0:
        return f"process id 0 given twice: here ({socket.gethostname()}) and on {who}"
    if pid in seen:
        return f"process id {pid} given twice: on {seen[pid]} and on {who}"
    seen[pid] = who
    return None


def _answer_roll(spec: JobSpec) -> None:
    assert spec.coordinator is not None
    host, port = _split_address(spec.coordinator)
    where = spec.origin.get("coordinator", "--coordinator")
    deadline = time.monotonic() + spec.timeout_s
    last: OSError | None = None
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=1.0)
            break
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            raise ConnectionError(
                f"the coordinator {spec.coordinator} (from {where}) did not answer within "
                f"{spec.timeout_s:g} s ({last}); is process 0 running, and is the address "
                f"reachable from this host? (--coordinator-timeout / ${ENV_TIMEOUT} set the wait)"
            )
        time.sleep(0.2)
    with conn:
        conn.settimeout(max(deadline - time.monotonic(), 1.0))
        try:
            conn.sendall(f"{ROLL_CALL} | {spec.num_processes} {_me(spec)}\n".encode())
            reply = _read_line(conn)
        except OSError as e:
            reply = f"<{e}>"
    if reply == "ok":
        return
    if reply.startswith("error "):
        raise ConfigError(f"{where}: process 0 refused the job: {reply[6:]}")
    raise ConnectionError(
        f"the coordinator {spec.coordinator} (from {where}) did not answer the roll call "
        f"(got {reply[:60]!r}): did the job start without this process (another process "
        f"with id {spec.process_id}?), or is something else listening there?"
    )


def join_job(spec: JobSpec) -> None:
    """Join the ``explicit`` or ``auto`` job (``jax.distributed.initialize``);
    an explicit job's ids are checked first (:func:`roll_call`)."""
    import jax

    if spec.mode not in ("explicit", "auto"):
        raise ValueError(f"join_job: mode {spec.mode!r} joins nothing")
    # CPU collectives across processes need gloo (GPU backends ignore this).
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = max(1, round(spec.timeout_s))
    if spec.mode == "auto":
        jax.distributed.initialize(initialization_timeout=timeout)
        return
    assert spec.coordinator is not None
    host = spec.coordinator.rpartition(":")[0]
    bind = spec.coordinator if host in ("127.0.0.1", "localhost", "[::1]") else None
    # XLA aborts the whole process on a RegisterTask timeout or a duplicate
    # id; the roll call refuses those first, with the ids named.
    roll_call(spec)
    jax.distributed.initialize(
        coordinator_address=spec.coordinator,
        coordinator_bind_address=bind,
        num_processes=spec.num_processes,
        process_id=spec.process_id,
        initialization_timeout=timeout,
    )


def schema_hash(schema_entries: Sequence[Mapping[str, Any]], shapes: Sequence[int]) -> int:
    """A 52-bit hash of the telemetry layout and the batch shapes (exact in a float64)."""
    h = hashlib.sha256(repr((list(shapes), [sorted(e.items()) for e in schema_entries])).encode())
    return int.from_bytes(h.digest()[:8], "little") >> 12


def gather_strings(text: str, width: int = 256) -> list[str]:
    """``text`` from every process, in process order (one host collective;
    on one process, ``[text]``). At most ``width`` characters each."""
    import jax
    import numpy as np

    if jax.process_count() == 1:
        return [text]
    from headwater.telemetry import Gather

    if len(text) > width:
        raise ValueError(f"gather_strings: {text!r} is longer than {width} characters")
    g = Gather.get()
    mine = np.asarray([float(ord(c)) for c in text.ljust(width, "\0")])
    rows = g.finish(g.start(mine)).reshape(jax.process_count(), -1)
    return ["".join(chr(int(c)) for c in row).rstrip("\0") for row in rows]


def check_same_schema(local_hash: int, describe: str) -> None:
    """Compare every rank's :func:`schema_hash` (one host collective); a
    mismatch is a :class:`ConfigError` naming the ranks of each group."""
    groups: dict[str, list[int]] = {}
    seen = gather_strings(f"{local_hash:x} {describe}")
    for r, row in enumerate(seen):
        groups.setdefault(row.split(" ", 1)[0], []).append(r)
    if len(groups) > 1:
        parts = [f"ranks {rs}: {seen[rs[0]].split(' ', 1)[1]}" for rs in groups.values()]
        raise ConfigError(
            "ranks disagree on the telemetry schema / batch shapes (processes started "
            "with different config files or versions?): " + "; ".join(parts)
        )
