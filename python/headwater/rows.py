"""The typed rows of the native tables, as the binding hands them to Python.

Each native table function returns a list of plain dicts; these
``TypedDict`` s name every field and its type, so a consumer's
``row["reduction"]`` is checked by mypy (pydantic-core's
``list_all_errors() -> list[ErrorTypeInfo]`` is the model). ``_native.pyi``
imports them; ``tests/python/test_rows.py`` checks every row the extension
returns against them, so a field added in Rust and not here (or a renamed
enum value) fails a test.

Owns: :class:`MetricRow` (``metric_table()``), :class:`TrainerGaugeRow`
(``trainer_gauges()``), :class:`SchemaEntry` (``telemetry_schema()``),
:class:`TensorRow` (``batch_tensors()``), :class:`ConfigKeyRow`
(``sampler_config_schema()``), :class:`SamplerConfigDict` (a whole,
normalised sampler config), :class:`EvalTaskRow`, :class:`VerifyReport`
and :class:`BenchRun`, and the ``Literal`` types of the tables' enum columns.

Must never: hold a value of a table (a key, a default, a range): those are
the extension's; only the shape of a row lives here.
"""

from __future__ import annotations

from typing import Literal, TypedDict

#: How a metric is reduced across ranks (``Reduction::name`` in Rust).
Reduction = Literal["MIN", "MAX", "SUM", "HISTOGRAM"]
#: The Prometheus type a metric is exported as.
PromType = Literal["gauge", "counter", "histogram"]
#: The bucket edges of a histogram metric.
BucketRule = Literal["hops", "pow2_up_to_s", "padding_ratio", "latency"]
#: How a quantile is read from a histogram's buckets.
QuantileRule = Literal["upper_edge", "midpoint"]
#: A batch tensor's NumPy dtype name.
Dtype = Literal["int8", "uint8", "uint16", "int32", "uint32", "uint64", "float16", "float32"]
#: A sampler config value as JSON gives it (a key's type is in ``ConfigKeyRow.type``).
ConfigValue = (
    bool | int | float | str | list[int] | list[float] | list[bool] | list[str] | dict[str, float] | None
)


class HealthyBand(TypedDict):
    """What ``headwater diag`` judges a metric by: a statistic of its values
    over a run's steps (``what``, in ``unit``) and the band a healthy run
    keeps it in (``hi`` None: no upper bound)."""

    what: str
    unit: str
    lo: float
    hi: float | None


def band_text(band: HealthyBand | None) -> str:
    """A healthy band as the dashboards and the metrics reference write it:
    ``<what> in [lo, hi]`` (the unit when the words lack it); empty for a
    metric not judged."""
    if not band:
        return ""
    hi = "∞)" if band["hi"] is None else f"{band['hi']:g}]"
    unit = "" if band["unit"] in band["what"] else f" ({band['unit']})"
    return f"{band['what']}{unit} in [{band['lo']:g}, {hi}"


class MetricRow(TypedDict):
    """One row of the metric table (``metric_table()``)."""

    key: str  # without the prefix; per-task rows as ``tasks/{task}``
    reduction: Reduction
    per_task: bool
    per_database: bool
    per_kind: bool  # one value per task kind (``task_kinds/{kind}``)
    prometheus: str
    prometheus_type: PromType
    unit: str
    help: str
    buckets: BucketRule | None  # None for scalars
    quantile: QuantileRule | None  # None for scalars
    healthy: HealthyBand | None  # None for a metric shown, not judged


class TrainerGaugeRow(TypedDict):
    """One trainer gauge the exporter serves (``trainer_gauges()``)."""

    key: str
    prometheus: str
    unit: str
    help: str


class SchemaEntry(TypedDict):
    """One entry of a sampler's telemetry layout (``telemetry_schema()``)."""

    key: str  # with the prefix, per-task keys expanded
    reduction: Reduction
    edges: list[float] | None  # None for scalars
    quantile: QuantileRule | None  # None for scalars
    help: str
    prometheus: str
    unit: str


class TensorRow(TypedDict):
    """One batch tensor (``batch_tensors()``): name, dtype and shape symbols."""

    name: str
    dtype: Dtype
    shape: list[str]  # symbols: "B", "S", "R", "U", "D", "K", digits


class ConfigCheck(TypedDict, total=False):
    """A key's allowed values as data: ``kind`` is ``int`` (``lo``..=``hi``),
    ``number`` (``lo``, ``hi``, ``open_lo``), ``bool``, ``choices``
    (``choices``) or ``rule`` (a rule over several keys, stated by ``text``)."""

    kind: Literal["int", "number", "bool", "choices", "rule"]
    lo: float
    hi: float
    open_lo: bool
    choices: list[str]
    text: str


class ConfigKeyRow(TypedDict):
    """One sampler config key (``sampler_config_schema()``)."""

    name: str
    type: str  # the Python type, as the stub's keyword writes it
    default: ConfigValue
    range: str
    doc: str
    stream: bool  # the key defines the batch stream
    group: Literal["seeds", "shape", "recipe", "resources", "telemetry", "debug"]
    check: ConfigCheck


class StepShape(TypedDict):
    """One step's shape: ``S`` cells per sequence, ``B`` sequences per rank."""

    S: int
    B: int


class StepShapes(TypedDict):
    """``step_shapes()``: every shape a train step may take, and the fixed
    shape of the val stream and evaluation passes."""

    train: list[StepShape]
    eval: StepShape


class SamplerConfigDict(TypedDict):
    """A whole sampler config, every key (``Sampler.config()``,
    ``validate_sampler_config()``)."""

    # BEGIN generated: sampler config
    # (written by `python -m headwater.docs_gen` from sampler_config_schema(); do not edit)
    rank: int
    world_size: int
    split_ratios: list[float]
    split_seed: int
    seed: int
    num_prefetch: int
    default_batch_size: int
    default_sequence_length: int
    sequence_lengths: list[int]
    tokens_per_batch: int | None
    bfs_child_width: int
    max_hops: int
    pack: bool
    pack_factor: int
    task_weights: list[float] | dict[str, float] | None
    task_pick: str
    task_mixing: str
    database_weights: list[float] | dict[str, float] | None
    telemetry_top_databases: int
    telemetry_databases: list[str]
    on_bad_database: str
    stage_dir: str | None
    num_threads: int | None
    max_rss_bytes: int | None
    memory_budget: int | None
    verify: str
    page_cache: str
    temporal_filter: bool
    recipe: str | None
    examples: bool
    local_context_sizes: list[int]
    bfs_widths: list[int]
    prefer_latest: list[bool]
    num_walks: int
    walk_length: int
    mask_prob_max: float
    example_ranker: str
    expected_prune: float
    expected_store: bool
    expected_store_rows: int
    context_deadline_ms: float | None
    telemetry: bool
    prometheus_port: int | None
    prometheus_host: str
    local_rank: int | None
    otlp_endpoint: str | None
    stall_after_ms: float | None
    stall_dump_dir: str | None
    pool_fraction: float
    seed_windows: int
    hot_set_bytes: int | None
    hot_set_steps: int
    debug_batch_delay_ms: float
    debug_repeat_seed_every: int
    debug_ignore_window: bool
    debug_panic_at_step: int | None
    debug_stall_step: int | None
    debug_stall_ms: float
    debug_drop_page_cache_every: int
    debug_page_cache_bytes: int | None
    debug_pin_cpu: int | None
    debug_spin_ms: float
    debug_cpu_hog: bool
    # END generated: sampler config


class EvalTaskRow(TypedDict):
    """One task of an evaluation pass (``EvalPass.tasks()``)."""

    task: str
    seeds: int  # seeds of the split
    rank_seeds: int  # of them on this rank
    batches: int


class VerifyReport(TypedDict):
    """What ``verify_database()`` found."""

    files: int
    bytes: int
    errors: list[str]  # one message per problem, naming its file


class BenchRun(TypedDict):
    """One ``bench_sampler()`` run's figures (``BenchRun`` in Rust)."""

    threads: int
    telemetry: bool
    batches: int
    seconds: float
    batches_per_s: float
    cells_per_s: float
    seeds_per_s: float
    tokens_per_s: float
    cpu_seconds: float
    tokens_per_cpu_s: float
    pack: bool
    segments: int
    contexts_cut: float
    fill: float
    bfs_ms: float
    assemble_ms: float
    collate_ms: float
    total_ms: float
    rss_bytes: int
    databases: int
    first_batch_seconds: float
    telemetry_us: float
    drained_values: int
    working_set_resident: float
    read_amplification: float


__all__ = [
    "BenchRun",
    "BucketRule",
    "ConfigCheck",
    "ConfigKeyRow",
    "ConfigValue",
    "Dtype",
    "EvalTaskRow",
    "HealthyBand",
    "MetricRow",
    "PromType",
    "QuantileRule",
    "Reduction",
    "SamplerConfigDict",
    "SchemaEntry",
    "StepShape",
    "StepShapes",
    "TensorRow",
    "TrainerGaugeRow",
    "VerifyReport",
    "band_text",
]
