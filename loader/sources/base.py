"""The seam between the loader and storage: what a source is, and the errors it raises.

Backends (one module each: `lance`, `arrow`) import this module; the registry imports the
backends. Nothing here imports a backend, so there is no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loader.storage import SourceUnreachableError, is_object_store

__all__ = [
    "Backend",
    "PinnedVersionGoneError",
    "ResolvedSource",
    "RowSource",
    "SourceRequest",
    "SourceSpec",
    "SourceUnreachableError",
    "check_columns",
    "read_schema",
]


class RowSource(Protocol):
    """An opened table that reads rows by position."""

    def __len__(self) -> int: ...

    def take(self, positions: NDArray[np.int64]) -> pa.Table:
        """Rows at `positions` (sorted ascending, unique), in that order."""
        ...


@dataclass(frozen=True)
class SourceSpec:
    """Everything needed to reopen the same rows in another process.

    `uri` is absolute and normalised (a local path made absolute, an object-store URI kept
    as a URI). `version_id` identifies the content of a pinned Lance version in a way a
    table dropped and recreated cannot reproduce. `storage_options` (credentials, endpoint)
    travel to workers by pickling but are never identity, never in a state, never in a
    repr; `data` carries what a worker needs to reopen an Arrow/Parquet source.
    """

    kind: str
    uri: str
    table: str | None = None
    version: int | None = None
    columns: tuple[str, ...] | None = None
    fingerprint: str | None = None
    version_id: str | None = None
    storage_options: dict[str, str] | None = field(default=None, compare=False, repr=False)
    data: Any = field(default=None, compare=False, repr=False)
    cache: Any = field(default=None, compare=False, repr=False)  # loader.cache.CacheSpec

    def identity(self) -> dict[str, Any]:
        """What goes in the state: enough to tell whether a resume reads the same table."""
        return {
            "kind": self.kind,
            "uri": self.uri,
            "table": self.table,
            "version": self.version,
            "version_id": self.version_id,
            "columns": list(self.columns) if self.columns is not None else None,
            "fingerprint": self.fingerprint,
        }


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
    # The columns a read returns, with their types: what a mixture compares at construction.
    schema: pa.Schema | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SourceRequest:
    """What the user asked of a source, besides the source itself."""

    columns: tuple[str, ...] | None
    filter: Any
    version: int | None
    storage_options: dict[str, str] | None
    cache: Any = None  # loader.cache.CacheSpec: where this node caches the data files


@dataclass(frozen=True)
class Backend:
    """One kind of source: which inputs it takes, how it pins them, how a worker reopens them."""

    kind: str
    accepts: Callable[[Any], bool]
    resolve: Callable[[Any, SourceRequest], ResolvedSource]
    open: Callable[[SourceSpec], RowSource]
    # The spec's identity as a saved one computed it (a state from before a scheme changed).
    identity_for: Callable[[SourceSpec, dict[str, Any]], dict[str, Any]] | None = None
    # Whether reading goes over the network (many reads in flight, a deadline on each):
    # by default, whether the spec's URI names an object store.
    remote: Callable[[SourceSpec], bool] = lambda spec: is_object_store(spec.uri)


class PinnedVersionGoneError(ValueError):
    """The version a run is pinned to (or its data files) no longer exists."""


def read_schema(schema: pa.Schema, columns: tuple[str, ...] | None) -> pa.Schema:
    """The part of `schema` a read of `columns` (None: all) returns, in that order."""
    if columns is None:
        return schema
    return pa.schema([schema.field(name) for name in columns])


def check_columns(columns: tuple[str, ...] | None, available: list[str], where: str) -> None:
    if columns is None:
        return
    unknown = [c for c in columns if c not in available]
    if unknown:
        raise ValueError(f"unknown columns {unknown} for {where}; available columns: {available}")
