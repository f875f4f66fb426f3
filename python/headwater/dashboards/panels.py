"""The rows of the headwater sampler dashboard, top to bottom.

Every query reads the per-rank series of the sampler's Prometheus exporter
(``Sampler(..., prometheus_port=...)``), filtered by ``rank=~"$rank"`` and
``split="$split"``, and reduces them across ranks the way the metric demands:
``min`` / ``max`` for ``MIN`` / ``MAX`` gauges, ``sum`` for counter rates,
and ``sum by (le)`` of the buckets before ``histogram_quantile`` (never an
average of per-rank quantiles). A query names its metric by its key in the
metric table (``headwater._native.metric_table()``); the Prometheus name and
the reduction come from the row (:mod:`.widgets`), so the rows here say only
what a panel shows.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m

from headwater.dashboards.widgets import (
    DATASOURCE,
    PanelBuilder,
    Q,
    _heatmap,
    _stat,
    _timeseries,
    across,
    increase,
    prom,
    quantile,
    worst,
)

#: Row titles, top to bottom.
ROWS: tuple[str, ...] = (
    "Pool health",
    "Task mix",
    "BFS",
    "In-context contexts",
    "Queue",
    "Stage latency",
    "Stalls and attribution",
    "Invariants",
    "Throughput",
)

STAGES: tuple[str, ...] = ("bfs", "assemble", "collate", "total")


def _pool_health() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Pool remaining seeds",
            "Seeds left before reshuffle in the least / most full active pool (cluster min of "
            "the per-rank min, cluster max of the per-rank max; per-rank series too). Healthy: "
            "a sawtooth that refills at each reshuffle. Pathological: the cluster min pinned "
            "near 0 (a pool keeps running out). The ranks read the same global pools, so the "
            "per-rank series coincide; ranks that differ run different stream configs.",
            [
                Q(across("pool/remaining_min"), "cluster min"),
                Q(across("pool/remaining_max"), "cluster max"),
                Q(across("pool/remaining_min", by="rank"), "rank {{rank}} min"),
                Q(across("pool/remaining_max", by="rank"), "rank {{rank}} max"),
            ],
        ),
        _timeseries(
            "Pool remaining fraction",
            "Fraction of its seeds the emptiest (cluster min of *_min_ratio) and fullest "
            "(cluster max of *_max_ratio) task pool still holds. Healthy: min and max move "
            "together (pools drain at matching speeds). Pathological: min near 0 while max stays "
            "high; one task's pool drains much faster than the mix intends.",
            [
                Q(across("pool/remaining_fraction_min"), "cluster min"),
                Q(across("pool/remaining_fraction_max"), "cluster max"),
            ],
            unit="percentunit",
            max_val=1,
        ),
        _timeseries(
            "Pool exhaust events/s",
            "Pools that ran out and reshuffled, per second, cluster sum and per rank (counted "
            "by the rank whose slice crosses the end of the global epoch). Healthy: rare bumps "
            "at epoch boundaries. Pathological: a sustained high rate (tiny pools, seeds "
            "repeat often). Seed windows opened (seed_windows) and hot set spans started "
            "(hot_set_bytes): the working set moved on; a read burst follows each.",
            [
                Q(across("pool/exhaust_events"), "cluster"),
                Q(
                    across("pool/exhaust_events", by="rank"),
                    "rank {{rank}}",
                ),
                Q(across("pool/window_rotations"), "windows opened"),
                Q(across("hot_sets/rotations"), "hot set spans started"),
            ],
            unit="ops",
        ),
        _timeseries(
            "Steps since pick (max)",
            "Batches since the least recently picked weighted task was picked (cluster max). "
            "Healthy: bounded and flat; every task gets picked. Pathological: grows without "
            "bound, a task is starved.",
            [Q(across("pool/steps_since_pick_max"), "cluster max")],
            span=12,
        ),
        _timeseries(
            "Steps to exhaust (min)",
            "Forecast batches until the first active pool runs out (cluster min). Healthy: "
            "large, or a steady countdown that resets on reshuffle. Pathological: stuck near 0; "
            "pools run out every few batches.",
            [Q(across("pool/steps_to_exhaust_min"), "cluster min")],
            span=12,
        ),
    ]


def _task_mix() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Task mix (seeds drawn/s by task)",
            "Seeds drawn per second by task, summed over ranks and stacked as a percentage of "
            "the total. Healthy: bands whose widths match the configured mix weights. "
            "Pathological: a band that shrinks to 0 (task starved) or drifts from its weight.",
            [
                Q(
                    across("tasks/{task}", by="task"),
                    "{{task}}",
                )
            ],
            unit="cps",
            span=16,
            stacking=common_m.StackingMode.PERCENT,
        ),
        _timeseries(
            "Task mix TV distance",
            "Total-variation distance of the recent task mix from the configured weights "
            "(cluster max, i.e. the worst rank; per rank too). Healthy: small and steady. "
            "Pathological: high or rising; the sampler is not delivering the requested mix.",
            [
                Q(across("mix/tv_distance"), "cluster max"),
                Q(across("mix/tv_distance", by="rank"), "rank {{rank}}"),
            ],
            unit="percentunit",
        ),
        *_database_mix(),
    ]


def _database_mix() -> list[PanelBuilder]:
    """A mixture's databases: per-database series exist for the reported
    (``telemetry_databases``, else the top ``telemetry_top_databases``)
    databases only; the rest are folded
    into ``other`` and the worst-database pointers. Empty for one database."""
    return [
        _timeseries(
            "Database mix (seeds drawn/s by database)",
            "Seeds drawn per second by reported database (the telemetry_databases list, else "
            "the top telemetry_top_databases by weight), and by all other databases together, "
            "summed over ranks and stacked as a "
            "percentage. Healthy: bands whose widths match the database weights. "
            "Pathological: a band at 0 (a database starved). Empty for one database.",
            [
                Q(
                    across("databases/{database}/seeds", by="database"),
                    "{{database}}",
                ),
                Q(across("databases/other_seeds"), "other databases"),
            ],
            unit="cps",
            span=12,
            stacking=common_m.StackingMode.PERCENT,
        ),
        _timeseries(
            "Database waits and TV distance",
            "Batches since the least recently picked weighted database was picked (cluster "
            "max; the worst database's mixture index as a pointer), per reported database, and "
            "the TV distance of the recent database mix from the weights, and the databases "
            "dropped at open or mid-run (on_bad_database = skip). Healthy: bounded, flat; TV small; none "
            "dropped. Pathological: a wait that grows with the run (starved database); a "
            "dropped database (its name and reason in database_metadata()).",
            [
                Q(across("databases/steps_since_pick_max"), "cluster max"),
                Q(across("databases/steps_since_pick_worst"), "worst database index"),
                Q(
                    across("databases/{database}/steps_since_pick", by="database"),
                    "{{database}}",
                ),
                Q(across("mix/database_tv_distance"), "database TV distance"),
                Q(across("databases/dropped"), "dropped databases"),
            ],
            span=12,
        ),
        _timeseries(
            "Database pools",
            "Remaining fraction of the least full active pool of any weighted database (cluster "
            "min; the worst database's mixture index as a pointer), per reported database, and "
            "its pools' exhaust events/s. Healthy: a sawtooth. Pathological: one database "
            "pinned near 0 (its pools are tiny for its weight).",
            [
                Q(across("databases/remaining_fraction_min"), "cluster min"),
                Q(across("databases/remaining_fraction_worst"), "worst database index"),
                Q(
                    across("databases/{database}/remaining_fraction_min", by="database"),
                    "{{database}}",
                ),
                Q(
                    across("databases/{database}/exhaust_events", by="database"),
                    "{{database}} exhausts/s",
                ),
            ],
            span=24,
        ),
    ]


def _seq_len_panel() -> PanelBuilder:
    """The step's S (``batch/seq_len``): constant, or drawn per step from
    ``sequence_lengths``."""
    return _timeseries(
        "Sequence length S p50/p99",
        "The S of each step from the cluster-merged buckets: default_sequence_length, or "
        "with sequence_lengths drawn per step at a fixed tokens_per_batch (B = tokens / S). "
        "Healthy: constant without sequence_lengths; with it p50 near the list's middle and "
        "the p99 at its longest. Pathological: one length only (the list not in effect).",
        [
            Q(quantile(0.5, "batch/seq_len"), "p50"),
            Q(quantile(0.99, "batch/seq_len"), "p99"),
        ],
        unit="short",
        span=6,
    )


def _bfs() -> list[PanelBuilder]:
    return [
        _heatmap(
            "BFS depth (hops)",
            "BFS hops reached per sequence (bucket increases summed over ranks). Healthy: a "
            "stable distribution with most sequences several hops deep. Pathological: mass at "
            "0 hops (seeds without neighbours) or a sudden shift.",
            "bfs/depth",
            unit="short",
        ),
        _heatmap(
            "BFS sequence rows",
            "Rows per sequence (bucket increases summed over ranks). Healthy: a tight band "
            "near what the sequence budget holds. Pathological: a long tail of tiny sequences "
            "(isolated seeds) or a sudden shift.",
            "bfs/rows",
            unit="short",
        ),
        _heatmap(
            "Padding fraction",
            "Padded share of each sequence (bucket increases summed over ranks). Healthy: mass "
            "near 0. Pathological: mass near 1; compute wasted on padding.",
            "padding/fraction",
            unit="percentunit",
        ),
        _timeseries(
            "Padding fraction p50/p95",
            "Median and 95th percentile of the padding fraction from the cluster-merged "
            "buckets. Healthy: p95 low (a few %). Pathological: p50 high, or p95 near 1.",
            [
                Q(quantile(0.5, "padding/fraction"), "p50"),
                Q(quantile(0.95, "padding/fraction"), "p95"),
            ],
            unit="percentunit",
            max_val=1,
            span=6,
        ),
        _timeseries(
            "Packing: segments per sequence and contexts cut/s",
            "With pack=True: median and 95th percentile of the seeds' contexts (segments) per "
            "sequence from the cluster-merged buckets, and contexts cut to the prefix that fits a "
            "packing budget below S per second (cluster sum). Healthy: segments around the "
            "seeds per sequence of the tasks (pack_factor, or measured per task with "
            "pack_factor = 0), a small cut rate (1 segment, no cuts without pack). Pathological: "
            "most contexts cut (pack_factor too high for the neighbourhoods reached).",
            [
                Q(quantile(0.5, "packing/segments_per_sequence"), "segments p50"),
                Q(quantile(0.95, "packing/segments_per_sequence"), "segments p95"),
                Q(across("packing/contexts_cut"), "contexts cut/s"),
            ],
            span=6,
        ),
        _timeseries(
            "Truncation cells dropped/s",
            "Cells of reached rows cut by the sequence budget, per second, cluster sum. "
            "Healthy: 0 or a small steady rate. Pathological: a large or rising rate; the "
            "sequence length is too short for the neighbourhoods reached.",
            [Q(across("truncation/cells_dropped"), "cluster")],
            unit="cps",
            span=6,
        ),
        _timeseries(
            "BFS children capped/s",
            "Visible children not sampled because of bfs_child_width, per second, cluster sum. "
            "Healthy: a steady rate set by the cap. Pathological: a jump; hub rows dominate "
            "and neighbourhoods are sampled thinly.",
            [Q(across("bfs/children_capped"), "cluster")],
            unit="cps",
            span=6,
        ),
        _timeseries(
            "BFS temporal filtered/s",
            "Children hidden by the observation-time filter, per second, cluster sum. Healthy: "
            "steady, roughly proportional to batches/s. Pathological: 0 on a temporal database "
            "(the filter is not applied) or a sudden swing.",
            [Q(across("bfs/temporal_filtered"), "cluster")],
            unit="cps",
            span=6,
        ),
    ]


_WAIT_SHARE = across("queue/wait_seconds", by="rank")


def _queue() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Queue depth per rank (min)",
            "Fewest batches waiting in the prefetch channel at a consumer call, per rank, plus "
            "the cluster min. Healthy: above 0; the sampler runs ahead of training. "
            "Pathological: 0 on a rank; that rank's training step waits for data.",
            [
                Q(across("queue/depth_min", by="rank"), "rank {{rank}}"),
                Q(across("queue/depth_min"), "cluster min"),
            ],
        ),
        _timeseries(
            "Data-wait share per rank",
            "Seconds the consumer blocked in next_*_batch per second of wall time, per rank "
            f"(rate of {prom('queue/wait_seconds')}_sum); the share of training time spent "
            "waiting for data. Healthy: ~0%. Pathological: a few % or more, input-bound.",
            [Q(_WAIT_SHARE, "rank {{rank}}")],
            unit="percentunit",
        ),
        _timeseries(
            "Data-wait share (worst rank)",
            "The largest per-rank data-wait share (cluster max): in synchronous data-parallel "
            "training the slowest rank sets the pace. Healthy: ~0%. Pathological: above a few "
            "%; the whole job is input-bound.",
            [Q(worst(_WAIT_SHARE), "worst rank")],
            unit="percentunit",
        ),
    ]


def _stage_latency() -> list[PanelBuilder]:
    faults = _timeseries(
        "Major page faults/s per rank",
        "Pages the sampler read from disk while building batches, per second, per rank and "
        "cluster sum (getrusage of the building thread). Healthy: ~0 once the database is in "
        "the page cache. Pathological: a steady rate with rising stage latency; the sampler "
        "waits on the disk (a database larger than memory, or a cold cache).",
        [
            Q(across("io/major_faults", by="rank"), "rank {{rank}}"),
            Q(across("io/major_faults"), "cluster"),
        ],
        span=6,
    )
    stages: list[PanelBuilder] = [
        _timeseries(
            f"Stage latency: {s}",
            f"p50 and p95 of the {s} stage time per batch, from buckets summed over ranks. "
            "Healthy: flat, with p95 close to p50. Pathological: p95 far above p50 (stragglers) "
            "or a rising trend.",
            [
                Q(quantile(0.5, f"stage/{s}_seconds"), "p50"),
                Q(quantile(0.95, f"stage/{s}_seconds"), "p95"),
            ],
            unit="s",
            span=6,
        )
        for s in STAGES
    ]
    return [faults, *stages]


def _stalls() -> list[PanelBuilder]:
    build = across("cpu/build_seconds")
    return [
        _stat(
            "Stalls (time range)",
            "Draws and batch builds that ran past stall_after_ms, over the dashboard's time "
            "range (cluster sum); each wrote the stuck thread's stack to the run directory "
            "(stall-rank<r>-*.txt). In-context contexts past context_deadline_ms count here "
            "too (without a dump). Healthy: 0 (green). Pathological: any (a stuck worker, a "
            "hub row, a fault storm): read the dump.",
            Q(increase("stalls"), "stall count", instant=True),
        ),
        _stat(
            "Stall dumps not written (time range)",
            "Stall stack dumps that could not be written (a read-only or missing dump "
            "directory), cluster sum. Healthy: 0. Pathological: above 0; the stalls are "
            "counted, their stacks lost: fix stall_dump_dir.",
            Q(increase("stall_dump_failures"), "failed dumps", instant=True),
        ),
        _timeseries(
            "Where the sampler's build time goes",
            "Shares of the building threads' time (cluster): on a CPU, runnable but waiting "
            "for one (schedstat run-queue), and blocked (page faults, reads). Healthy: mostly "
            "busy. Pathological: run-queue >= 25% with data wait is cpu_starved (an "
            "overloaded host); blocked >= 10% with major faults is io_bound (a cold cache).",
            [
                Q(f"{across('cpu/busy_seconds')} / {build}", "on CPU"),
                Q(f"{across('cpu/runqueue_seconds')} / {build}", "runnable, not running"),
                Q(f"{across('io/blocked_seconds')} / {build}", "blocked"),
            ],
            unit="percentunit",
            span=12,
        ),
        _timeseries(
            "Bytes read from storage/s per rank",
            "Bytes the building threads caused to be read from storage per second (page faults "
            "of the mapped database included), per rank. Healthy: ~0 once the database is "
            "cached. Pathological: a steady rate beside rising stage latency (io_bound).",
            [
                Q(across("io/read_bytes", by="rank"), "rank {{rank}}"),
                Q(across("hot_sets/prefetched_bytes"), "hot sets read ahead"),
            ],
            unit="Bps",
            span=12,
        ),
        _timeseries(
            "Time to first batch",
            "Seconds from the start of the open until the first batch was made (slowest "
            "rank). Healthy: the open plus one batch. Pathological: tens of seconds (a cold "
            "cache, a large database to verify).",
            [Q(across("first_batch_seconds"), "slowest rank")],
            unit="s",
            span=12,
        ),
    ]


def _working_set() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Working set in the page cache",
            "Of the pages the batches were about to read (four sampled cells a batch, probed "
            "with mincore before assembly reads them), the share already in the page cache: "
            "worst rank and each rank. Healthy: ~1 once warm, a database larger than memory "
            "read a window at a time included. Pathological: low and staying low (the working "
            "set does not fit the memory, or cold storage): io_bound names which.",
            [
                Q(across("io/working_set_resident"), "worst rank"),
                Q(across("io/working_set_resident", by="rank"), "rank {{rank}}"),
            ],
            unit="percentunit",
            span=12,
        ),
        _timeseries(
            "Read amplification",
            "Bytes read from storage per byte the batches used (their cells and the text "
            "embeddings they collated): worst rank and each rank. Healthy: 0 from the page "
            "cache, about 1 reading only what is used. Pathological: tens (read-ahead and "
            "whole pages bring in what no batch uses: a locality row order and seed windows "
            "cut it).",
            [
                Q(across("io/read_amplification"), "worst rank"),
                Q(across("io/read_amplification", by="rank"), "rank {{rank}}"),
            ],
            span=12,
        ),
    ]


def _invariants() -> list[PanelBuilder]:
    return [
        _stat(
            "Duplicate seeds (time range)",
            "Seeds drawn twice in one epoch on one rank, over the dashboard's time range "
            "(cluster sum). Healthy: 0 (green). Pathological: anything above 0 (red) is a bug.",
            Q(increase("invariants/duplicate_seeds"), "duplicates", instant=True),
        ),
        _stat(
            "Temporal leaks (time range)",
            "Rows with a time after the seed's observation time, over the dashboard's time "
            "range (cluster sum). Healthy: 0 (green). Pathological: above 0 (red); future "
            "information leaks into training.",
            Q(increase("invariants/temporal_leaks"), "leaks", instant=True),
        ),
        _timeseries(
            "Invariant violations/s per rank",
            "Rates of duplicate seeds, temporal leaks and label leaks per rank. Healthy: flat "
            "at 0. "
            "Pathological: any non-zero series, which names the offending rank.",
            [
                Q(across("invariants/duplicate_seeds", by="rank"), "duplicate seeds rank {{rank}}"),
                Q(across("invariants/temporal_leaks", by="rank"), "temporal leaks rank {{rank}}"),
                Q(across("invariants/label_leaks", by="rank"), "label leaks rank {{rank}}"),
            ],
            unit="cps",
            span=12,
        ),
        _stat(
            "Unverified block reads",
            "Database blocks the sampler read with no checksum to check them (a format-1 "
            'database opened without verify="full"), most on any rank. Healthy: 0 (green); '
            "every byte in every batch was checked. Pathological: above 0 (red); rebuild the "
            'database with this version or open it with verify="full".',
            Q(across("integrity/unverified_reads"), "unverified", instant=True),
        ),
        _timeseries(
            "Blocks verified per rank",
            "Database blocks (4 KiB pages; 256 KiB in tasks; with examples, the walk graph's "
            "too) hashed on their first read and found intact since the sampler opened, per "
            "rank. Healthy: rises over the first batches, then flattens (each block read has "
            "been checked once). Pathological: flat at 0 while batches flow (a format-1 "
            "database: see unverified reads); a corrupt block stops the sampler with a "
            "FormatError naming the file and block.",
            [Q(across("integrity/blocks_verified", by="rank"), "rank {{rank}}")],
            unit="short",
            span=12,
        ),
        _stat(
            "Label leaks (time range)",
            "Label cells shown although the label became known only after the seed's "
            "observation time (a loan's outcome before its return), over the dashboard's time "
            "range (cluster sum). Healthy: 0 (green). Pathological: above 0 (red); the model "
            "reads outcomes from the future.",
            Q(increase("invariants/label_leaks"), "label leaks", instant=True),
        ),
    ]


def _throughput() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Batches delivered/s",
            "Batches handed to the trainer per second, cluster sum and per rank. Healthy: flat, "
            "ranks equal. Pathological: dips (stalls), or one rank below the rest (it holds "
            "back the synchronous step).",
            [
                Q(across("batches"), "cluster"),
                Q(across("batches", by="rank"), "rank {{rank}}"),
            ],
            unit="ops",
            span=24,
        ),
        _timeseries(
            "Sampler start-up (s)",
            "Seconds from Sampler(...) to ready: open (O(metadata), no payload read), "
            "preparation and the seed pools, per rank and the slowest. Healthy: seconds, "
            "flat across restarts and database sizes. Pathological: growing with the database "
            "(a cold page cache read, verify=\"full\"), or one rank far slower (its disk).",
            [
                Q(across("startup_seconds", by="rank"), "rank {{rank}}"),
                Q(across("startup_seconds"), "slowest rank"),
            ],
            unit="s",
            span=12,
        ),
        _timeseries(
            "Sampler resumes",
            "Restores of the sampler from a saved state (resume or reshard) over the time "
            "range, per rank. "
            "Healthy: one step per job restart. Pathological: repeated resumes (a crash loop) "
            "or ranks disagreeing (some ranks restarted, others not).",
            [
                Q(increase("resumes", by="rank"), "rank {{rank}}"),
            ],
            unit="short",
            span=12,
        ),
    ]


# --------------------------------------------------------------------------- dashboard


def _variables() -> list[dash_b.QueryVariable | dash_b.DatasourceVariable | dash_b.CustomVariable]:
    train = dash_m.VariableOption(selected=True, text="train", value="train")
    val = dash_m.VariableOption(selected=False, text="val", value="val")
    # test: the test evaluation passes' series (val: the val stream and passes).
    test = dash_m.VariableOption(selected=False, text="test", value="test")
    return [
        dash_b.DatasourceVariable("datasource")
        .label("Data source")
        .id("datasource")
        .type("prometheus"),
        dash_b.QueryVariable("rank")
        .id("rank")
        .label("Rank")
        .datasource(DATASOURCE)
        .query(f"label_values({prom('batches')}, rank)")
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dash_m.VariableSort.NUMERICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dash_m.VariableOption(selected=True, text=["All"], value=["$__all"])),
        dash_b.CustomVariable("split")
        .id("split")
        .label("Split")
        .values("train,val,test")
        .current(train)
        .options([train, val, test]),
    ]
