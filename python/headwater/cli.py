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

from headwater.bench.cli import add_bench


def _cmd_corpus(a: argparse.Namespace) -> int:
    from headwater.preprocessing.corpus import format_corpus_report, parse_shard, preprocess_corpus

    if a.schema or a.memory_limit or a.overwrite or a.embedder != "auto" or a.row_order != "source":
        raise ValueError(
            "with --corpus, --schema/--embedder/--memory-limit/--overwrite/--row-order go in the "
            "corpus manifest ([defaults] or each [[source]])"
        )
    shard = parse_shard(a.shard) if a.shard else None
    r = preprocess_corpus(a.source, a.out_dir, shard=shard, fail_fast=a.fail_fast, ray=a.ray,
                          ray_address=a.ray_address)
    print(json.dumps(r, indent=2) if a.json else format_corpus_report(r))
    return 1 if r["counts"]["failed"] else 0


def _cmd_preprocess(a: argparse.Namespace) -> int:
    from headwater.preprocessing import preprocess

    if a.corpus:
        return _cmd_corpus(a)
    if a.shard or a.fail_fast or a.json or a.ray or a.ray_address:
        raise ValueError("--shard, --fail-fast, --json, --ray and --ray-address go with --corpus")
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
        row_order=a.row_order,
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
    from headwater.evaluation.eval_run import main as eval_main

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
    add_bench(sub)
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
    """preprocess, inspect, verify, default-db."""
    _add_preprocess(sub)

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


def _add_preprocess(sub: Sub) -> None:
    """preprocess: one source, or a corpus with ``--corpus``."""
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
        "--row-order",
        choices=["source", "locality"],
        default="source",
        help="locality: each table's rows grouped under their parent's, so a context's rows lie "
        "on few pages (with the sampler's seed_windows, a database larger than memory is read "
        "from a working set that fits, for tasks whose contexts follow the grouping); source: "
        "the source's order",
    )
    pp.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="preprocessing memory budget beside the interpreter (e.g. 512MiB; default: "
        "preprocess()'s, 2GiB): DuckDB gets a third and spills past it to OUT_DIR.duckdb_tmp; "
        "columns are streamed in chunks",
    )
    pp.add_argument(
        "--corpus",
        action="store_true",
        help="SOURCE is a corpus manifest (TOML) or a directory of sources, OUT_DIR the output "
        "root: one database per source and OUT_DIR/corpus.toml, a mixture file of them; "
        "idempotent, resumable, a failing source reported and the rest built",
    )
    pp.add_argument(
        "--shard",
        metavar="I/N",
        help="with --corpus: build only shard I of N (0 <= I < N; sources dealt by size), e.g. "
        "--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT",
    )
    pp.add_argument(
        "--fail-fast", action="store_true", help="with --corpus: stop at the first failed source"
    )
    pp.add_argument("--json", action="store_true", help="with --corpus: print the report as JSON")
    pp.add_argument(
        "--ray",
        action="store_true",
        help="with --corpus: build the sources as Ray tasks (one per source, a source's "
        "memory_limit its Ray memory) on a local Ray instance started for the run",
    )
    pp.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="with --corpus: ... on the running Ray cluster whose head is HOST:PORT (OUT_DIR on a "
        "file system every node shares)",
    )
    pp.set_defaults(func=_cmd_preprocess)


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
