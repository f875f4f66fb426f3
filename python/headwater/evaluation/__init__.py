"""Scoring a model on a database's val/test tasks: evaluation passes over
the mesh, RelBench's metric definitions, and ``headwater eval RUN_DIR``
(a run's checkpoint scored without training).

Rooms: :mod:`.scoring` (the metrics of one task's predictions with
scikit-learn's definitions, the best constant baseline, the per-task
table), :mod:`.evaluate` (the jitted predict step, :class:`~.evaluate.Evaluator`
walking ``sampler.eval_batches``, predictions gathered over ranks and
scored, a pass's W&B rows and progress line), :mod:`.padder` (the shapes
every rank feeds a step, agreed over the mesh: a pass's and the training
step's) and :mod:`.eval_run` (``headwater eval``: pick a committed
checkpoint, rebuild the run's config from its launch record, refuse one
written under another database or model, restore the parameters and run
the passes on one process).

It uses the model (:mod:`headwater.model`), the mesh
(:mod:`headwater.cluster`), a run's config (:mod:`headwater.runconfig`)
and its checkpoints (:mod:`headwater.rundir`). Must never: import the run
(:mod:`headwater.train`, which uses this room for its validation and
evaluation passes), ``headwater bench``, ``diag`` or the command line
(``tests/python/test_layout.py`` fails on such an import); train, or draw
from the training stream. Importing this package does not import JAX.
"""
