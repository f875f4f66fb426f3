"""The ``headwater`` command line: one subcommand per job (preprocess,
inspect, verify, default-db, bench, train, eval, diag); ``diag`` has its own parser
(:func:`headwater.diag.main`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _cmd_preprocess(a: argparse.Namespace) -> int:
    from headwater.preprocessing import preprocess

    if Path(a.out_dir).exists() and not a.overwrite:
        # The CLI's own wording: the flag, not preprocess()'s keyword.
        raise ValueError(f"out_dir {a.out_dir} already exists (add --overwrite to replace it)")
    t0 = time.perf_counter()
    out = preprocess(
        a.source,
        a.out_dir,
        schema=a.schema,
        embedder=a.embedder,
        overwrite=a.overwrite,
        time_columns=a.time_columns,
        **({"memory_limit": a.memory_limit} if a.memory_limit else {}),
    )
    print(f"preprocessed {a.source} → {out} in {time.perf_counter() - t0:.1f} s")
    return 0


def _cmd_inspect(a: argparse.Namespace) -> int:
    from headwater.inspection import format_report, inspect

    r = inspect(a.db_dir)
    print(json.dumps(r, indent=2) if a.json else format_report(r))
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    from headwater.inspection import verify

    r = verify(a.db_dir, progress=not a.quiet)
    for e in r["errors"]:
        print(f"headwater verify: {e}", file=sys.stderr)
    verdict = f"{len(r['errors'])} problem(s)" if r["errors"] else "ok"
    print(f"verified {r['files']} files, {r['bytes']} payload bytes: {verdict}")
    return 1 if r["errors"] else 0


def _cmd_default_db(a: argparse.Namespace) -> int:
    from headwater.data.default_db import default_database

    print(default_database(scale_factor=a.scale_factor, embedder=a.embedder))
    return 0


def _cmd_bench(a: argparse.Namespace) -> int:
    from headwater.bench import _bench_source, examples_recipe, format_bench, run_bench

    if a.model:
        from headwater.train.step_bench import parse_model_sets, run_step_bench

        _, path, _ = _bench_source(a.db)
        sets = parse_model_sets(a.model_set)
        presets = a.model.split(",")
        print(json.dumps(run_step_bench(path, presets, a.batch_size, a.seq_len, sets, a.rounds)))
        return 0
    if a.sequence_lengths:
        return _bench_varlen(a)
    if a.embedder:
        from headwater.bench_embed import format_embed_bench, run_embed_bench

        r = run_embed_bench(a.embedder, a.strings, a.rounds)
        print(json.dumps(r) if a.json else format_embed_bench(r))
        return 0
    threads = [int(t) for t in a.threads.split(",")] if a.threads else None
    factors = [0 if f == "auto" else int(f) for f in a.pack_factors.split(",")] if a.pack_factors else None
    overrides: dict[str, Any] = {}
    if a.examples:
        overrides.update(examples_recipe(_bench_source(a.db)[1], a.seq_len))
    if a.sampler_set:
        from headwater.train.origins import toml_value

        for kv in a.sampler_set:
            key, sep, value = kv.partition("=")
            if not sep:
                raise SystemExit(f"--sampler-set {kv!r}: expected KEY=VALUE")
            overrides[key.strip()] = toml_value(value.strip())
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


def _bench_varlen(a: argparse.Namespace) -> int:
    """``bench --sequence-lengths``: variable against fixed S at one token budget."""
    from headwater.bench_varlen import format_varlen_bench, run_varlen_bench
    from headwater.train.origins import toml_value

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


def _port_or_auto(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a port, 0 or "auto"') from None


def _cmd_train(a: argparse.Namespace) -> int:
    from headwater.train import launch, parse_overrides

    overrides = parse_overrides(a.set)
    if a.steps is not None:
        overrides["train.steps"] = a.steps
    if a.profile:
        overrides["train.profile"] = True
    if a.db:
        overrides["database.path"] = a.db
    if a.wandb_mode:
        overrides["logging.wandb_mode"] = a.wandb_mode
    if a.prometheus_port is not None:
        overrides["logging.prometheus_port"] = a.prometheus_port
    if a.dir:
        overrides["logging.dir"] = a.dir
    summaries = launch(
        a.config,
        num_processes=a.num_processes,
        run_name=a.run_name,
        resume=a.resume,
        coordinator=a.coordinator,
        process_id=a.process_id,
        coordinator_timeout_s=a.coordinator_timeout,
        reshard=a.reshard,
        **overrides,
    )
    signum = int(summaries[0].get("interrupted_signal") or 0)
    # Interrupted (SIGTERM/SIGINT): checkpointed and the resume command
    # printed; the exit status is the shell's for that signal.
    return 128 + signum if signum else 0


def _cmd_eval(a: argparse.Namespace) -> int:
    from headwater.train.eval_run import main as eval_main

    if a.max_seeds is not None and a.max_seeds < 1:
        raise ValueError(f"--max-seeds must be >= 1, got {a.max_seeds}")
    return eval_main(a.run_dir, a.split, a.max_seeds, a.step)


def _add_eval(sub: Sub) -> None:
    pe = sub.add_parser(
        "eval",
        help="evaluate a run's training checkpoint on val/test: per-task metrics and baselines",
    )
    pe.add_argument("run_dir", help="a run directory written by `headwater train`")
    pe.add_argument(
        "--split",
        choices=("val", "test", "both"),
        default="test",
        help="which split's full pass to score (default: test)",
    )
    pe.add_argument(
        "--step", type=int, help="which checkpoint (default: the latest committed one)"
    )
    pe.add_argument("--max-seeds", type=int, help="seeds per task (default: the whole split)")
    pe.set_defaults(func=_cmd_eval)


def _cmd_diag(a: argparse.Namespace) -> int:
    from headwater.diag import main as diag_main

    return diag_main(a.args[1:] if a.args[:1] == ["--"] else a.args)


def build_parser() -> argparse.ArgumentParser:
    from headwater import __version__

    p = argparse.ArgumentParser(
        prog="headwater",
        description="An observability-first sampler for relational transformers: build a "
        "database, sample and benchmark it, train on it, and prove its health signals.",
    )
    p.add_argument("--version", action="version", version=f"headwater {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_data_commands(sub)
    _add_bench(sub)
    _add_train(sub)
    _add_eval(sub)
    _add_diag(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["diag"]:  # its own parser (headwater.diag.main)
        argv = ["diag", "--", *argv[1:]]
    args = build_parser().parse_args(argv)
    from headwater.errors import HeadwaterError

    try:
        return int(args.func(args))
    except (HeadwaterError, ValueError, FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"headwater {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # A training start-up stopped by a signal says which and exits with
        # the shell's status for it; a plain Ctrl-C elsewhere: 130.
        signum = int(getattr(e, "signum", 0) or 2)
        print(f"headwater {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return 128 + signum


Sub = Any  # argparse's private _SubParsersAction


def _add_data_commands(sub: Sub) -> None:
    """preprocess, inspect, default-db."""
    pp = sub.add_parser("preprocess", help="build a database from a relational source")
    pp.add_argument(
        "source", help="RelBench folder, DuckDB/SQLite file, or directory of Parquet/CSV files"
    )
    pp.add_argument("out_dir", help="output database directory (written atomically)")
    pp.add_argument(
        "--schema", help="schema file (TOML or JSON): keys, time columns, semantic types, tasks"
    )
    pp.add_argument(
        "--embedder", default="auto", help="minilm, hash, or auto (minilm when installed)"
    )
    pp.add_argument("--overwrite", action="store_true", help="replace out_dir if it exists")
    pp.add_argument(
        "--time-columns",
        choices=["propose", "none"],
        default="propose",
        help="propose: a source declaring no time columns gets one proposed per table (printed "
        "as a schema line) and a loud warning where none fits; none: no proposals",
    )
    pp.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="preprocessing memory budget beside the interpreter (e.g. 512MiB; default: "
        "preprocess()'s, 2GiB): DuckDB gets a third and spills past it to OUT_DIR.duckdb_tmp; "
        "columns are streamed in chunks",
    )
    pp.set_defaults(func=_cmd_preprocess)

    pi = sub.add_parser("inspect", help="validate a database and summarise it")
    pi.add_argument("db_dir", help="a preprocessed database directory")
    pi.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pi.set_defaults(func=_cmd_inspect)

    pv = sub.add_parser(
        "verify", help="check every payload checksum and the graph (reads the whole database)"
    )
    pv.add_argument("db_dir", help="a preprocessed database directory")
    pv.add_argument("--quiet", action="store_true", help="no progress bar")
    pv.set_defaults(func=_cmd_verify)

    pd = sub.add_parser(
        "default-db", help="build (once) and print the path of the default TPC-H database"
    )
    pd.add_argument(
        "--scale-factor",
        type=float,
        default=0.01,
        help="TPC-H scale factor (default: %(default)s, about 87 K rows; 1 is about 8.6 M)",
    )
    pd.add_argument(
        "--embedder", default="auto", help="minilm, hash, or auto (minilm when installed)"
    )
    pd.set_defaults(func=_cmd_default_db)


def _add_bench(sub: Sub) -> None:
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
    for add_args in (_add_examples_args, _add_step_bench_args, _add_varlen_args, _add_embed_bench_args):
        add_args(pb)
    pb.add_argument("--json", action="store_true", help="print one JSON object")
    pb.set_defaults(func=_cmd_bench)


def _add_embed_bench_args(pb: argparse.ArgumentParser) -> None:
    """``bench --embedder minilm``: JAX against numpy strings/s (:mod:`headwater.bench_embed`)."""
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
        "weight 0): docs/contexts.md",
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
    """``bench --sequence-lengths``: variable against fixed S (:mod:`headwater.bench_varlen`)."""
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
    """``bench --model``: the device-only train step (:mod:`headwater.train.step_bench`)."""
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


def _add_train(sub: Sub) -> None:
    pt = sub.add_parser(
        "train",
        help="train the relational transformer on a database (default: the embedded TPC-H one)",
    )
    pt.add_argument("config", nargs="?", help="TOML config (see diag_configs/healthy.toml)")
    pt.add_argument("--steps", type=int, help="override train.steps")
    pt.add_argument(
        "--num-processes",
        type=int,
        help="processes in the job (env HEADWATER_NUM_PROCESSES); without --coordinator, "
        "start them here on one loopback jax.distributed job",
    )
    pt.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="join a multi-host job: process 0's address (env HEADWATER_COORDINATOR); "
        "needs --num-processes and --process-id. Under SLURM / Open MPI, omit it: "
        "the launcher's environment is read",
    )
    pt.add_argument(
        "--process-id", type=int, help="this process's id in the job (env HEADWATER_PROCESS_ID)"
    )
    pt.add_argument(
        "--coordinator-timeout",
        type=float,
        metavar="SECONDS",
        help="wait at most this long for the coordinator and the other processes "
        "(env HEADWATER_COORDINATOR_TIMEOUT_S; default 300)",
    )
    pt.add_argument("--profile", action="store_true", help="print the step-time breakdown")
    pt.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue RUN_DIR from its last checkpoint (its config and process count; flags "
        "given here on top); each run directory's resume.sh holds the exact command",
    )
    pt.add_argument(
        "--reshard",
        action="store_true",
        help="with --resume and --num-processes: continue on another number of processes "
        "(prints what changes: the global batch; the run is no longer bit-identical)",
    )
    pt.add_argument("--db", help="override database.path")
    pt.add_argument("--run-name", help="override logging.run_name")
    pt.add_argument("--dir", help="override logging.dir (where runs are written)")
    pt.add_argument(
        "--wandb-mode",
        choices=["offline", "online", "disabled"],
        help="override logging.wandb_mode (default: offline)",
    )
    pt.add_argument(
        "--prometheus-port",
        type=_port_or_auto,
        help='override logging.prometheus_port (0 = off, "auto" = free ports, printed and '
        "listed in the run's prometheus_targets.json)",
    )
    pt.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override any config key (value read as TOML), e.g. --set model.d_model=128; "
        "every key, its default and meaning: docs/reference/config.md",
    )
    pt.set_defaults(func=_cmd_train)


def _add_diag(sub: Sub) -> None:
    pg = sub.add_parser(
        "diag",
        help="run diagnostic configs and check which sampler-health signals light up",
        add_help=False,
    )
    pg.add_argument("args", nargs=argparse.REMAINDER, help="see: headwater diag --help")
    pg.set_defaults(func=_cmd_diag)


if __name__ == "__main__":
    sys.exit(main())
