"""A run directory's state on disk: what ``headwater train`` leaves behind
so that ``--resume RUN_DIR`` can continue the run and ``headwater eval
RUN_DIR`` can score it.

Rooms: :mod:`.checkpoint` (the launch record ``launch.json`` and
``resume.sh``, orbax checkpoints under ``checkpoints/<step>/`` with their
JSON ``meta``, the final-phase marker, the resume checks, ``metrics.jsonl``
truncation and the W&B resume filter).

Used by the run (:mod:`headwater.train`: saving, resuming, the launcher's
checks) and by ``headwater eval`` (:mod:`headwater.evaluation`: reading a
checkpoint back). Must never: import either, the model or the cluster
(parameters and
optimiser state are opaque pytrees here, the config a duck-typed
``TrainConfig``; ``tests/python/test_layout.py`` fails on such an import).
Importing this package does not import JAX or orbax.
"""
