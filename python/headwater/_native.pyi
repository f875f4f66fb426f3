"""Type stubs for the compiled core (kept by hand, checked by stubtest)."""

import os
from typing import Any, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "FORMAT_VERSION",
    "ConfigError",
    "Database",
    "DatabaseWriter",
    "FormatError",
    "HeadwaterError",
    "SchemaError",
    "__version__",
    "hash_embed",
]

FORMAT_VERSION: int
__version__: str

class HeadwaterError(Exception): ...
class FormatError(HeadwaterError): ...
class SchemaError(HeadwaterError): ...
class ConfigError(HeadwaterError): ...

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
    def add_table(
        self,
        name: str,
        num_rows: int,
        primary_key: str | None,
        time_column: str | None,
        row_time: npt.NDArray[np.int64],
        columns: list[tuple[Any, ...]],
        foreign_keys: list[tuple[Any, ...]],
        fingerprint: str,
    ) -> None: ...
    def add_cell_task(
        self, name: str, table: str, column: str, description: str | None = None
    ) -> None: ...
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
        categories: Any = None,
        query: str | None = None,
        description: str | None = None,
    ) -> None: ...
    def num_tables(self) -> int: ...
    def num_resumed(self) -> int: ...
    def column_texts(self) -> list[str]: ...
    def category_texts(self) -> list[str]: ...
    def text_values(self) -> list[str]: ...
    def columns_json(self) -> str: ...
    def finish(
        self,
        column_embeddings: npt.NDArray[np.float16],
        categorical_embeddings: npt.NDArray[np.float16],
        text_embeddings: npt.NDArray[np.float16],
        overwrite: bool = False,
    ) -> str: ...

def hash_embed(texts: list[str], dim: int) -> npt.NDArray[np.float16]: ...
