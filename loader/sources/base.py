"""The seam between the loader and storage: a Protocol and a picklable spec."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray


class RowSource(Protocol):
    """An opened table that reads rows by position."""

    def __len__(self) -> int: ...

    def take(self, positions: NDArray[np.int64]) -> pa.Table:
        """Rows at `positions` (sorted ascending, unique), in that order."""
        ...


@dataclass(frozen=True)
class SourceSpec:
    """Everything needed to reopen the same rows in another process.

    `data` carries an in-memory Arrow table (it travels to spawned workers by pickling);
    `storage_options` are passed to Lance for object stores. Neither is identity.
    """

    kind: str
    uri: str
    table: str | None = None
    version: int | None = None
    columns: tuple[str, ...] | None = None
    fingerprint: str | None = None
    storage_options: dict[str, str] | None = field(default=None, compare=False)
    data: Any = field(default=None, compare=False, repr=False)

    def identity(self) -> dict[str, Any]:
        """What goes in the state: enough to tell whether a resume reads the same table."""
        return {
            "kind": self.kind,
            "uri": self.uri,
            "table": self.table,
            "version": self.version,
            "columns": list(self.columns) if self.columns is not None else None,
            "fingerprint": self.fingerprint,
        }

    def open(self) -> RowSource:
        from loader.sources.open import open_source

        return open_source(self)


@dataclass(frozen=True)
class ResolvedSource:
    """A spec plus the filter's result: `rows[p]` is the table position of plan position p.

    `rows` is None without a filter (plan positions are table positions), so an unfiltered
    plan never holds O(N) memory.
    """

    spec: SourceSpec
    num_rows: int
    rows: NDArray[np.int64] | None
    filter: str | None
