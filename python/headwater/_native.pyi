"""Type stubs for the compiled core (kept by hand, checked by stubtest)."""

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

from headwater.rows import (
    BenchRun,
    ConfigKeyRow,
    EvalTaskRow,
    MetricRow,
    SamplerConfigDict,
    SchemaEntry,
    StepShapes,
    TensorRow,
    TrainerGaugeRow,
    VerifyReport,
)

__all__ = [
    "BATCH_KEYS",
    "FORMAT_VERSION",
    "TELEMETRY_PREFIX",
    "ConfigError",
    "Database",
    "DatabaseWriter",
    "EvalPass",
    "FormatError",
    "HeadwaterError",
    "ResourceError",
    "Sampler",
    "SamplerShutdown",
    "SchemaError",
    "StateError",
    "WorkerError",
    "__version__",
    "batch_tensors",
    "bench_sampler",
    "hash_embed",
    "metric_table",
    "peak_rss_bytes",
    "ranker_recall",
    "sampler_config_schema",
    "step_shapes",
    "telemetry_schema_for",
    "trainer_gauges",
    "validate_sampler_config",
    "verify_database",
]

FORMAT_VERSION: int
BATCH_KEYS: list[str]
TELEMETRY_PREFIX: str
__version__: str

# The exception classes print as `headwater.errors.<Name>` (their
# `__module__`); `headwater.errors` and `headwater` export these objects.
class HeadwaterError(Exception): ...
class FormatError(HeadwaterError): ...
class SchemaError(HeadwaterError): ...
class ConfigError(HeadwaterError, ValueError):
    """Raised by the core, names the key (``key``), the offending value as
    given (``value``; None for an unknown key or a setting that fails as a
    whole) and what is wrong (``what``); all None when raised by Python code
    that names no key. When several keys are bad (a config is checked
    whole), ``errors`` lists one ``ConfigError`` per key and the attributes
    above are the first's; else it is None."""

    key: str | None
    value: str | None
    what: str | None
    errors: list[ConfigError] | None

class StateError(HeadwaterError):
    """Raised by the core, names the state field that does not fit
    (``field``) and how (``what``)."""

    field: str | None
    what: str | None

class SamplerShutdown(HeadwaterError): ...
class WorkerError(HeadwaterError): ...
class ResourceError(HeadwaterError): ...

@final
class Database:
    """An open, validated headwater database directory."""

    def __new__(cls, path: str | os.PathLike[str]) -> Database: ...
    def metadata_json(self) -> str: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def bytes_on_disk(self) -> int: ...
    def column(self, table: int, slot: int) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint8]]: ...
    def graph_arrays(self) -> dict[str, npt.NDArray[Any]]: ...
    def task_arrays(self, k: int) -> dict[str, npt.NDArray[Any]]: ...
    def embeddings(self, which: str) -> npt.NDArray[np.float16]: ...
    def embedded_string(self, which: str, i: int) -> str: ...

@final
class DatabaseWriter:
    """Builds a database directory from typed column arrays."""

    def __new__(
        cls, out_dir: str | os.PathLike[str], source: str, embedder: str, dim: int
    ) -> DatabaseWriter: ...
    def resume_table(self, fingerprint: str) -> bool: ...
    def begin_table(
        self,
        name: str,
        num_rows: int,
        primary_key: str | None,
        time_column: str | None,
        fingerprint: str,
        num_stored: int,
    ) -> None: ...
    def set_stats_cutoff(self, cutoff_us: int) -> None: ...
    def set_row_times(self, row_time: npt.NDArray[np.int64]) -> None: ...
    def add_column(
        self,
        name: str,
        stype: str,
        source_type: str,
        inferred: bool,
        values: npt.NDArray[Any] | None = None,
        valid: npt.NDArray[np.uint8] | None = None,
        extra: Sequence[str] | None = None,
    ) -> None: ...
    def end_table(
        self, row_time: npt.NDArray[np.int64], foreign_keys: list[tuple[str, str, npt.NDArray[np.int64], int, int]]
    ) -> None: ...
    def add_cell_task(
        self, name: str, table: str, column: str, description: str | None = None
    ) -> None: ...
    def set_label_rule(
        self, name: str, label_time_column: str | None = None, label_columns: Sequence[str] = ...
    ) -> None: ...
    def set_window(self, name: str, window_us: int) -> None: ...
    def set_candidate_recall(self, name: str, share: float) -> None: ...
    def set_seed_only(self, name: str) -> None: ...
    def add_task(
        self,
        name: str,
        kind: str,
        anchor_table: str,
        anchor_rows: npt.NDArray[np.uint32],
        obs_time: npt.NDArray[np.int64],
        target_stype: str,
        values: npt.NDArray[Any],
        valid: npt.NDArray[np.uint8],
        categories: Sequence[str] | None = None,
        query: str | None = None,
        description: str | None = None,
        splits: npt.NDArray[np.uint8] | None = None,
    ) -> None: ...
    def num_tables(self) -> int: ...
    def num_resumed(self) -> int: ...
    def column_texts(self) -> list[str]: ...
    def category_texts(self) -> list[str]: ...
    def intern_texts(self, offsets: npt.NDArray[np.int64], bytes: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]: ...
    def num_text_values(self) -> int: ...
    def text_values(self, start: int, stop: int) -> list[str]: ...
    def columns_json(self) -> str: ...
    def finish(
        self,
        column_embeddings: npt.NDArray[np.float16],
        categorical_embeddings: npt.NDArray[np.float16],
        text_embeddings: npt.NDArray[np.float16],
        overwrite: bool = False,
    ) -> str: ...

def hash_embed(texts: list[str], dim: int) -> npt.NDArray[np.float16]: ...

def ranker_recall(
    db_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    seeds: int = 1000,
    ranker: str = "adaptive",
    same_key: bool = False,
    sampler_overrides: str | None = None,
) -> list[dict[str, Any]]: ...
def bench_sampler(
    db_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    threads: int,
    steps: int,
    warmup: int = 10,
    batch_size: int = 32,
    sequence_length: int = 1024,
    seed: int = 0,
    bfs_child_width: int = 16,
    max_hops: int = 3,
    telemetry: bool = True,
    pack: bool = False,
    pack_factor: int = 0,
    database_weights: list[float] | None = None,
    page_cache: str = "lazy",
    window: tuple[float, float] | None = None,
    sampler_overrides: str | None = None,
    seconds: float | None = None,
) -> BenchRun: ...
def peak_rss_bytes() -> int | None: ...
def verify_database(
    path: str | os.PathLike[str], progress: Callable[[int, int], object] | None = None
) -> VerifyReport: ...
def batch_tensors() -> list[TensorRow]: ...
def metric_table() -> list[MetricRow]: ...
def trainer_gauges() -> list[TrainerGaugeRow]: ...
def telemetry_schema_for(
    task_names: Sequence[str], max_hops: int, sequence_length: int
) -> list[SchemaEntry]: ...
def sampler_config_schema() -> list[ConfigKeyRow]: ...
def validate_sampler_config(
    config: Mapping[str, object], task_names: Sequence[str] | None = None
) -> SamplerConfigDict: ...
def step_shapes(config: Mapping[str, object]) -> StepShapes:
    """The shapes a valid config's steps take, by the core's rule: each train
    step's ``S`` and ``B`` (sequences per rank; ``tokens_per_batch / S`` with
    ``sequence_lengths``) and the val stream's and evaluation passes' fixed
    shape. A bad config raises ``ConfigError``."""

@final
class Sampler:
    """Prefetching sampler for the train and val splits of one database or a
    mixture of databases (a list of database folders).

    Safe to share between threads: each split's batches go to callers one at
    a time, every batch exactly once and in step order (each caller sees
    increasing steps); ``state_dict()``, ``drain_step_metrics()``, ``skip()``
    and ``load_state_dict()`` may run beside them. Waits release the GIL and
    wake to check Ctrl-C. See docs/sampling.md, "Threads"."""

    def __new__(
        cls,
        db_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        config: Mapping[str, object] | None = None,
        state: Mapping[str, object] | str | bytes | None = None,
        *,
        # BEGIN generated: sampler keywords
        # (written by `python -m headwater.docs_gen` from sampler_config_schema(); do not edit)
        rank: int = 0,
        world_size: int = 1,
        split_ratios: tuple[float, float, float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        seed: int = 0,
        num_prefetch: int = 3,
        default_batch_size: int = 32,
        default_sequence_length: int = 1024,
        sequence_lengths: list[int] | tuple[int, ...] = (),
        tokens_per_batch: int | None = None,
        bfs_child_width: int = 16,
        max_hops: int = 3,
        pack: bool = False,
        pack_factor: int = 0,
        task_weights: list[float] | dict[str, float] | None = None,
        task_pick: str = "weighted",
        task_mixing: str = "step",
        database_weights: list[float] | dict[str, float] | None = None,
        telemetry_top_databases: int = 8,
        telemetry_databases: list[str] | tuple[str, ...] = (),
        on_bad_database: str = "error",
        stage_dir: str | None = None,
        num_threads: int | None = None,
        max_rss_bytes: int | None = None,
        memory_budget: int | None = None,
        verify: str = "header",
        page_cache: str = "lazy",
        temporal_filter: bool = True,
        recipe: str | None = None,
        examples: bool = False,
        local_context_sizes: list[int] | tuple[int, ...] = (256, 512, 1024),
        bfs_widths: list[int] | tuple[int, ...] = (8, 16, 32, 64, 128, 256),
        prefer_latest: list[bool] | tuple[bool, ...] = (False, True),
        num_walks: int = 10000,
        walk_length: int = 20,
        mask_prob_max: float = 0.0,
        example_ranker: str = "walks",
        expected_prune: float = 0.25,
        expected_store: bool = False,
        expected_store_rows: int = 96,
        context_deadline_ms: float | None = None,
        telemetry: bool = True,
        prometheus_port: int | None = None,
        prometheus_host: str = "127.0.0.1",
        local_rank: int | None = None,
        otlp_endpoint: str | None = None,
        stall_after_ms: float | None = None,
        stall_dump_dir: str | None = None,
        pool_fraction: float = 1.0,
        seed_windows: int = 1,
        hot_set_bytes: int | None = None,
        hot_set_steps: int = 1000,
        # END generated: sampler keywords
    ) -> Sampler: ...
    def next_train_batch(self) -> dict[str, npt.NDArray[Any]]:
        """The next train batch (blocks, GIL released; Ctrl-C interrupts). From
        several threads: each batch to exactly one caller, in step order."""
    def next_val_batch(self) -> dict[str, npt.NDArray[Any]]:
        """The next val-stream batch; the same thread contract as the train's."""
    def column_embeddings(self) -> npt.NDArray[np.float16]: ...
    def categorical_embeddings(self) -> npt.NDArray[np.float16]: ...
    def database_metadata(self) -> dict[str, Any]: ...
    def config(self) -> SamplerConfigDict: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def num_threads(self) -> int: ...
    def queue_depth(self, split: str = "train") -> int: ...
    def shutdown(self) -> None: ...
    @property
    def is_shut_down(self) -> bool: ...
    def __enter__(self) -> Sampler: ...
    def __exit__(self, *_args: object) -> bool: ...
    def drain_step_metrics(self, split: str = "train") -> dict[str, float]: ...
    def drain_step_metrics_packed(self, split: str = "train") -> npt.NDArray[np.float64]: ...
    def telemetry_keys(self) -> list[str]: ...
    def telemetry_schema(self) -> list[SchemaEntry]: ...
    def replay_batch(
        self, step: int, split: str = "train", rank: int | None = None
    ) -> dict[str, npt.NDArray[Any]]: ...
    def export_trainer(self, values: dict[str, float]) -> None: ...
    def state_dict(self) -> dict[str, Any]:
        """The state as of delivery; taken while another thread receives a
        batch, each split's state is from before or after that batch."""
    def load_state_dict(self, state: Mapping[str, object] | str | bytes) -> None:
        """Continue every split from ``state``; anything that is not a
        state that fits (random bytes, another snapshot) is a ``StateError``."""
    def check_state_dict(self, state: Mapping[str, object] | str | bytes) -> None:
        """Raise ``StateError`` where ``load_state_dict(state)`` would;
        restores and logs nothing."""
    def skip(self, n: int, split: str = "train") -> None: ...
    def eval_batches(
        self, split: str = "val", task: str | None = None, max_seeds: int | None = None
    ) -> EvalPass: ...
    def _last_batch_pointers(self) -> list[tuple[str, int]]: ...

@final
class EvalPass:
    """A finite, ordered pass over every seed of a val/test split on this rank;
    each batch taken is recorded in that split's telemetry. Threads may share
    one pass: each batch goes to exactly one caller, in pass order."""

    def __iter__(self) -> EvalPass: ...
    def __next__(self) -> dict[str, npt.NDArray[Any]]: ...
    def __len__(self) -> int: ...
    def tasks(self) -> list[EvalTaskRow]: ...
