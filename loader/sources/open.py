"""Opened sources: thin adapters over Lance and Arrow `take`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
from numpy.typing import NDArray

from loader.sources.base import RowSource, SourceSpec


class LanceRows:
    """A Lance dataset at one version, read with positional `take` (logical offsets)."""

    def __init__(self, dataset: Any, columns: list[str] | None) -> None:
        self._dataset = dataset
        self._columns = columns
        self._len = dataset.count_rows()

    def __len__(self) -> int:
        return self._len

    def take(self, positions: NDArray[np.int64]) -> pa.Table:
        return self._dataset.take(positions, columns=self._columns)


class ArrowRows:
    """An Arrow table or dataset read with `take`."""

    def __init__(self, data: pa.Table | pads.Dataset, columns: list[str] | None) -> None:
        self._data = data
        self._columns = columns
        self._len = data.num_rows if isinstance(data, pa.Table) else data.count_rows()

    def __len__(self) -> int:
        return self._len

    def take(self, positions: NDArray[np.int64]) -> pa.Table:
        indices = pa.array(positions, type=pa.int64())
        if isinstance(self._data, pa.Table):
            table = self._data.take(indices)
            return table.select(self._columns) if self._columns is not None else table
        return self._data.take(indices, columns=self._columns)


def open_lance(uri: str, version: int | None, storage_options: dict[str, str] | None) -> Any:
    """Open a Lance dataset at a version, with an error that says what to do if it is gone."""
    import lance

    try:
        return lance.dataset(uri, version=version, storage_options=storage_options)
    except (ValueError, OSError, RuntimeError) as err:
        if version is None:
            raise
        raise ValueError(
            f"cannot open version {version} of the table at {uri!r}: {err}. The run is pinned "
            f"to that version; if it was removed by cleanup_old_versions/optimize, restore it "
            f"from a backup or resume with a fresh state. Tag versions you may resume from "
            f"(table.tags.create('run-x', version)) so cleanup keeps them."
        ) from err


def open_source(spec: SourceSpec) -> RowSource:
    columns = list(spec.columns) if spec.columns is not None else None
    if spec.kind in ("lancedb", "lance"):
        return LanceRows(open_lance(spec.uri, spec.version, spec.storage_options), columns)
    if spec.kind == "arrow":
        return ArrowRows(spec.data, columns)
    if spec.kind == "parquet":
        return ArrowRows(pads.dataset(list(spec.data), format="parquet"), columns)
    raise ValueError(f"unknown source kind {spec.kind!r}")
