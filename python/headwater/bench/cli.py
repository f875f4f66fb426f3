"""``headwater bench``'s command line: its flags, grouped by what they
measure (thread scaling and packing, ``--memory-limit`` runs in a cgroup,
in-context recipes, the model's step, variable sequence lengths), and the
dispatch to the module that measures each (:mod:`headwater.bench`,
:mod:`headwater.bench.limits`, :mod:`headwater.bench.varlen`,
:mod:`headwater.bench.step`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _cmd_bench(a: argparse.Namespace) -> int:
    from headwater.bench import _bench_source, examples_recipe, format_bench, run_bench

    if a.model:
        from headwater.bench.step import parse_model_sets, run_step_bench

        _, path, _ = _bench_source(a.db)
        sets = parse_model_sets(a.model_set)
        presets = a.model.split(",")
        print(json.dumps(run_step_bench(path, presets, a.batch_size, a.seq_len, sets, a.rounds)))
        return 0
    if a.sequence_lengths:
        return _bench_varlen(a)
    if a.embedder:
        from headwater.bench.embed import format_embed_bench, run_embed_bench

        r = run_embed_bench(a.embedder, a.strings, a.rounds)
        print(json.dumps(r) if a.json else format_embed_bench(r))
        return 0
    threads = [int(t) for t in a.threads.split(",")] if a.threads else None
    factors = [0 if f == "auto" else int(f) for f in a.pack_factors.split(",")] if a.pack_factors else None
    overrides: dict[str, Any] = {}
    if a.examples:
        overrides.update(examples_recipe(_bench_source(a.db)[1], a.seq_len))
    if a.sampler_set:
        from headwater.runconfig.origins import toml_value

        for kv in a.sampler_set:
            key, sep, value = kv.partition("=")
            if not sep:
                raise SystemExit(f"--sampler-set {kv!r}: expected KEY=VALUE")
            overrides[key.strip()] = toml_value(value.strip())
    if a.memory_limit:
        return _bench_limited(a, overrides)
    if a.ranker_recall:
        from headwater.bench import run_ranker_recall

        overrides.setdefault("examples", True)
        rr = run_ranker_recall(a.db, a.seeds, a.ranker, a.batch_size, overrides, a.same_key)
        print(json.dumps(rr))
        return 0
    r = run_bench(
        a.db,
        a.batch_size,
        a.seq_len,
        threads,
        a.steps,
        a.warmup,
        telemetry=a.telemetry,
        pack_factors=factors,
        rounds=a.rounds,
        page_cache=a.page_cache,
        process_scaling=a.process_scaling,
        train_steps=a.train_steps,
        train_seeds=a.train_seeds,
        train_overrides=a.train_set,
        sampler_overrides=overrides or None,
    )
    print(json.dumps(r) if a.json else format_bench(r))
    return 0


def _bench_limited(a: argparse.Namespace, overrides: dict[str, Any]) -> int:
    """``bench --memory-limit``: runs in a memory cgroup and an I/O throttle."""
    from headwater.bench import _bench_source
    from headwater.bench.limits import (
        LimitError,
        Limits,
        format_limited,
        parse_size,
        run_limited_bench,
    )

    try:
        mems = [parse_size(m) for m in a.memory_limit.split(",")]
        bps = parse_size(a.read_bps, "--read-bps") if a.read_bps else None
        limits = [Limits(m, bps, a.read_iops) for m in mems]
        _, path, weights = _bench_source(a.db)
        threads = int(a.threads.split(",")[0]) if a.threads else 1
        r = run_limited_bench(
            path, limits, threads, a.seconds, a.warmup, a.rounds,
            {"batch_size": a.batch_size, "sequence_length": a.seq_len,
             "database_weights": weights, "page_cache": a.page_cache,
             "telemetry": a.telemetry != "off",
             "sampler_overrides": json.dumps(overrides) if overrides else None},
        )
    except (LimitError, ValueError) as e:
        print(f"headwater bench: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r) if a.json else format_limited(r))
    return 0


def _bench_varlen(a: argparse.Namespace) -> int:
    """``bench --sequence-lengths``: variable against fixed S at one token budget."""
    from headwater.bench.varlen import format_varlen_bench, run_varlen_bench
    from headwater.runconfig.origins import toml_value

    if not a.tokens_per_batch:
        raise SystemExit("--sequence-lengths needs --tokens-per-batch")
    overrides = {}
    for kv in a.sampler_set:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--sampler-set {kv!r}: expected KEY=VALUE")
        overrides[key.strip()] = toml_value(value.strip())
    r = run_varlen_bench(
        a.db,
        [int(x) for x in a.sequence_lengths.split(",")],
        a.tokens_per_batch,
        a.seq_len,
        int(a.threads.split(",")[0]) if a.threads else 1,
        a.steps,
        a.warmup,
        a.rounds,
        overrides,
    )
    print(json.dumps(r) if a.json else format_varlen_bench(r))
    return 0



def add_bench(sub: Any) -> None:
    """The ``bench`` subcommand and its flags."""
    pb = sub.add_parser(
        "bench", help="measure sampler throughput, stages, scaling, handoff, memory"
    )
    pb.add_argument("db", nargs="?", help="database directory (default: the default database)")
    pb.add_argument(
        "--batch-size", type=int, default=32, help="sequences per batch (default: %(default)s)"
    )
    pb.add_argument(
        "--seq-len", type=int, default=1024, help="cells per sequence (default: %(default)s)"
    )
    pb.add_argument("--threads", help="comma-separated thread counts (default: 1 and all CPUs)")
    pb.add_argument(
        "--steps", type=int, default=200, help="measured batches per run (default: %(default)s)"
    )
    pb.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="batches drawn before measuring (default: %(default)s)",
    )
    pb.add_argument(
        "--telemetry",
        choices=["on", "off", "both"],
        default="on",
        help="record step telemetry in the runs; 'both' also measures the on/off ratio",
    )
    pb.add_argument(
        "--pack-factors",
        help="comma-separated pack_factor values ('auto' or 0: per task) to compare with unpacked "
        "(useful cells/s, batches/s, padding; interleaved runs)",
    )
    pb.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds of the packing comparison and of --process-scaling, best kept "
        "(default: %(default)s)",
    )
    pb.add_argument(
        "--page-cache",
        choices=["lazy", "willneed", "populate", "mlock"],
        default="lazy",
        help="the sampler's page_cache key in every run (populate: read in, as huge pages where "
        "the kernel allows, before timing; default: %(default)s)",
    )
    _add_comparison_args(pb)
    for add_args in (
        _add_limit_args, _add_examples_args, _add_step_bench_args, _add_varlen_args,
        _add_embed_bench_args,
    ):
        add_args(pb)
    pb.add_argument("--json", action="store_true", help="print one JSON object")
    pb.set_defaults(func=_cmd_bench)


def _add_comparison_args(pb: argparse.ArgumentParser) -> None:
    """``bench --process-scaling`` / ``--train-steps``: what the thread runs are read against."""
    pb.add_argument(
        "--process-scaling",
        action="store_true",
        help="also time one one-thread process alone, then as many as the largest thread count at "
        "once over the same wall-clock window (alternating, best of --rounds): the machine's own "
        "scaling of this workload, with nothing shared, to read the thread scaling against",
    )
    pb.add_argument(
        "--train-steps",
        type=int,
        default=0,
        help="also train the model unpacked and at each --pack-factors for this many steps (real "
        "`headwater train` runs at --batch-size and --seq-len): useful cells/s of the model, "
        "evaluation metrics at equal steps (default: 0, off)",
    )
    pb.add_argument(
        "--train-seeds",
        type=int,
        default=1,
        help="seeds of the training comparison, each training every configuration "
        "(default: %(default)s)",
    )
    pb.add_argument(
        "--train-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a `headwater train --set` value for the training comparison's runs (repeatable)",
    )


def _add_limit_args(pb: argparse.ArgumentParser) -> None:
    """``bench --memory-limit``: a smaller host and slower storage (docs/benchmarks)."""
    pb.add_argument(
        "--memory-limit",
        metavar="BYTES[,BYTES...]",
        help="run the sampler in a memory cgroup of this size (page cache included; e.g. 600MiB; "
        "'none' for no limit), the page cache dropped first; several, comma-separated, are "
        "interleaved over --rounds and compared to the first (needs root)",
    )
    pb.add_argument(
        "--read-bps", metavar="BYTES", help="with --memory-limit: throttle reads of the "
        "database's disk to this many bytes/s (e.g. 200MiB)",
    )
    pb.add_argument(
        "--read-iops", type=int, metavar="N", help="with --memory-limit: throttle reads of the "
        "database's disk to N operations/s",
    )
    pb.add_argument(
        "--seconds", type=float, default=20.0, help="with --memory-limit: seconds timed per run "
        "after the warm-up (default: %(default)s)",
    )


def _add_embed_bench_args(pb: argparse.ArgumentParser) -> None:
    """``bench --embedder minilm``: JAX against numpy strings/s (:mod:`headwater.bench.embed`)."""
    pb.add_argument(
        "--embedder",
        choices=["minilm"],
        help="time the embedder instead: strings/s of its JAX and numpy forward passes on the "
        "same TPC-H comments, alternating, best of --rounds",
    )
    pb.add_argument(
        "--strings", type=int, default=1000, help="strings of --embedder (default: %(default)s)"
    )


def _add_examples_args(pb: argparse.ArgumentParser) -> None:
    """``bench --examples`` / ``--sampler-set``: in-context contexts (docs/contexts.md)."""
    pb.add_argument(
        "--examples",
        action="store_true",
        help="time in-context contexts with RT-J's pretraining recipe (examples on, 10,000 walks "
        "of 20 rows, its local sizes and widths up to --seq-len, both recencies; query tasks "
        "without a label window weight 0): docs/contexts.md",
    )
    pb.add_argument(
        "--sampler-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a sampler key (TOML value) set in the thread-count runs, after --examples "
        "(repeatable), e.g. --sampler-set num_walks=1000",
    )
    pb.add_argument(
        "--ranker-recall",
        action="store_true",
        help="print JSON per task: recall@k of --ranker against the walks ranker, of walks "
        "against an independent walks run (the ceiling), and their builds per CPU-second, over "
        "--seeds seeds (with --examples / --sampler-set's recipe)",
    )
    pb.add_argument("--seeds", type=int, default=1000, help="seeds per task of --ranker-recall")
    pb.add_argument(
        "--ranker",
        choices=["expected", "adaptive", "walks", "shuffled"],
        default="adaptive",
        help="the ranker --ranker-recall measures (shuffled: a broken one, for tests)",
    )
    pb.add_argument(
        "--same-key",
        action="store_true",
        help="--ranker-recall: the ranker walks on the reference's generator (walks: recall 1)",
    )


def _add_varlen_args(pb: argparse.ArgumentParser) -> None:
    """``bench --sequence-lengths``: variable against fixed S (:mod:`headwater.bench.varlen`)."""
    pb.add_argument(
        "--sequence-lengths",
        help="comma-separated S values: time variable length (each step draws its S, "
        "B = --tokens-per-batch / S) against fixed S = --seq-len at the same budget, alternating "
        "--rounds, on the first --threads count (default 1); --sampler-set applies to both",
    )
    pb.add_argument(
        "--tokens-per-batch",
        type=int,
        help="with --sequence-lengths: cells per batch (B x S), e.g. 131072",
    )


def _add_step_bench_args(pb: argparse.ArgumentParser) -> None:
    """``bench --model``: the device-only train step (:mod:`headwater.bench.step`)."""
    pb.add_argument(
        "--model",
        metavar="PRESET[,PRESET]",
        help="instead: time the device-only train step (forward, forward+backward, step, "
        "tokens/s, MFU, peak memory) of each model preset (default, rt, rt-j) on one cached "
        "batch; prints JSON",
    )
    pb.add_argument(
        "--model-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [model] key over the presets of --model (repeatable)",
    )
