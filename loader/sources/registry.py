"""The registry of source backends: which kinds exist, and which one takes a given input.

Adding a backend is one module (its `Backend`: accepts, resolve, open) and one line here.
"""

from __future__ import annotations

from typing import Any

from loader.sources.arrow import ARROW, PARQUET
from loader.sources.base import Backend, ResolvedSource, RowSource, SourceRequest, SourceSpec
from loader.sources.lance import LANCE, LANCEDB
from loader.storage import read_deadline

# In the order inputs are tried: a path to a Lance dataset is Lance, any other path Parquet.
SOURCES: dict[str, Backend] = {b.kind: b for b in (LANCEDB, LANCE, ARROW, PARQUET)}


def backend(kind: str) -> Backend:
    """The backend for a spec's kind; an unknown kind lists the known ones."""
    try:
        return SOURCES[kind]
    except KeyError:
        raise ValueError(
            f"unknown source kind {kind!r}; known kinds: {', '.join(sorted(SOURCES))}"
        ) from None


def open_source(spec: SourceSpec) -> RowSource:
    """Reopen a spec's rows (in any process: a DataLoader worker calls this after pickling)."""
    return backend(spec.kind).open(spec)


def is_remote(spec: SourceSpec) -> bool:
    """Whether the spec's rows are read over the network (its backend says; memory is not)."""
    return backend(spec.kind).remote(spec)


def identity_for(spec: SourceSpec, saved: dict[str, Any]) -> dict[str, Any]:
    """The spec's identity to compare with a saved one (which may use an older scheme)."""
    found = backend(spec.kind)
    return found.identity_for(spec, saved) if found.identity_for else spec.identity()


def resolve_source(
    source: Any,
    *,
    columns: list[str] | None = None,
    filter: Any = None,
    version: int | None = None,
    storage_options: dict[str, str] | None = None,
    cache: Any = None,
) -> ResolvedSource:
    """Pin `source` to one version, check columns, and evaluate the filter once."""
    cols = tuple(columns) if columns is not None else None
    request = SourceRequest(cols, filter, version, storage_options, cache)
    read_deadline(storage_options)  # a bad value fails here, not at the first read
    for candidate in SOURCES.values():
        if candidate.accepts(source):
            resolved = candidate.resolve(source, request)
            read_deadline(resolved.spec.storage_options)  # the table's own options too
            return resolved
    raise TypeError(
        f"unsupported source {type(source).__name__}: pass a LanceDB table, a lance.LanceDataset, "
        f"a pyarrow.Table, a pyarrow.dataset.FileSystemDataset, or a path or URI to Lance or "
        f"Parquet (known kinds: {', '.join(sorted(SOURCES))})"
    )
