"""The processes of a job and the devices they share: how a process joins
a job, how the job's devices form one mesh, how a signal stops a process,
how a dead or hung rank is named, and how a launcher starts and watches
local processes.

Rooms: :mod:`.job` (alone, N local processes on loopback, or a process of
a SLURM / Open MPI job: ``jax.distributed`` behind a roll call, the
start-up schema check), :mod:`.mesh` (every device of every process on
one data axis, global arrays, the element-wise maximum over ranks),
:mod:`.stopping` (SIGTERM/SIGINT acknowledged at once, a stop flag the
loop reads), :mod:`.watchdog` (a lost rank named within
``train.peer_timeout_s``), :mod:`.workers` (N local processes started,
signalled and watched by PID).

Must never: know of the model or of a run's config, loop or checkpoints
(:mod:`headwater.model`, :mod:`headwater.runconfig`,
:mod:`headwater.rundir`, :mod:`headwater.train`; what a run wants reported
it hands over, as :data:`.watchdog.Recovery`). ``tests/python/test_layout.py``
fails on an import of any of them. Importing this package does not import
JAX.
"""
