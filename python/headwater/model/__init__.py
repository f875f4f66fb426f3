"""The relational transformer in plain JAX: the network, its heads and loss,
its optimiser and the shapes it is fed.

Rooms: :mod:`.transformer` (:class:`~.transformer.ModelConfig`, parameters,
the forward pass, the loss and the jitted train / eval steps),
:mod:`.attention` (the masks of each attention kind and the attention
itself), :mod:`.cat_head` (the categorical head's logits in bounded
memory), :mod:`.targets` (where a batch's targets are and what each one
is), :mod:`.accum` (gradient accumulation), :mod:`.optim` (Muon + AdamW and
the learning-rate schedule), :mod:`.scale` (presets, rematerialisation, the
FLOP count of a step) and :mod:`.device` (sampler batches → static-shape
device arrays).

Must never: know of a run or a rank (a run's config is
:mod:`headwater.runconfig`'s, its checkpoints :mod:`headwater.rundir`'s,
step loops :mod:`headwater.train`'s, processes and meshes
:mod:`headwater.cluster`'s; ``tests/python/test_layout.py`` fails on an
import of any of them).
Importing this package does not import JAX.
"""
