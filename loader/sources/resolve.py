"""From what the user passed to a pinned, filtered `ResolvedSource`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from loader.sources.base import ResolvedSource, SourceSpec
from loader.sources.open import open_lance

_FINGERPRINT_ROWS = 64


def _is_lancedb_table(source: Any) -> bool:
    return type(source).__module__.startswith("lancedb") and hasattr(source, "to_lance")


def _is_lance_dataset(source: Any) -> bool:
    return type(source).__module__.startswith("lance") and hasattr(source, "take")


def _looks_like_lance(path: str) -> bool:
    return path.rstrip("/").endswith(".lance") or os.path.isdir(os.path.join(path, "_versions"))


def _check_columns(columns: list[str] | None, available: list[str], where: str) -> None:
    if columns is None:
        return
    unknown = [c for c in columns if c not in available]
    if unknown:
        raise ValueError(f"unknown columns {unknown} for {where}; available columns: {available}")


def _table_fingerprint(table: pa.Table) -> str:
    """Schema, row count and the first and last rows: cheap, and catches a different table."""
    digest = hashlib.sha256(f"{table.schema}|{table.num_rows}".encode())
    for part in (
        table.slice(0, _FINGERPRINT_ROWS),
        table.slice(max(0, table.num_rows - _FINGERPRINT_ROWS)),
    ):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_table(part)
        digest.update(sink.getvalue().to_pybytes())
    return "sha256:" + digest.hexdigest()


def _files_fingerprint(dataset: pads.FileSystemDataset) -> str:
    """Files, sizes, row counts and schema of a Parquet dataset."""
    digest = hashlib.sha256(str(dataset.schema).encode())
    for fragment in dataset.get_fragments():
        size = dataset.filesystem.get_file_info(fragment.path).size
        digest.update(f"|{fragment.path}|{size}|{fragment.metadata.num_rows}".encode())
    return "sha256:" + digest.hexdigest()


def _lance_filtered(dataset: Any, filter: str | None) -> tuple[int, np.ndarray | None]:
    if filter is None:
        return dataset.count_rows(), None
    try:
        offsets = dataset.to_table(columns=["_rowoffset"], filter=filter).column(0)
    except Exception as err:  # Lance raises several types for a bad SQL predicate
        raise ValueError(f"filter {filter!r} failed on {dataset.uri!r}: {err}") from err
    rows = np.sort(offsets.to_numpy().astype(np.int64, copy=False))
    return len(rows), rows


def _arrow_filtered(data: pa.Table | pads.Dataset, filter: Any) -> tuple[int, np.ndarray | None]:
    if filter is None:
        return (data.num_rows if isinstance(data, pa.Table) else data.count_rows()), None
    if not isinstance(filter, pc.Expression):
        raise TypeError(
            f"filter {filter!r} for an Arrow/Parquet source must be a pyarrow.compute "
            f"Expression such as pc.field('label') == 3; SQL strings need a LanceDB or Lance source"
        )
    batches = (
        data.to_batches() if isinstance(data, pa.Table) else data.to_batches(batch_size=1 << 16)
    )
    kept, offset = [], 0
    try:
        for batch in batches:
            index = pa.array(np.arange(offset, offset + batch.num_rows, dtype=np.int64))
            table = pa.Table.from_batches([batch]).append_column("__position", index)
            kept.append(table.filter(filter).column("__position").to_numpy())
            offset += batch.num_rows
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
        raise ValueError(f"filter {filter} failed: {err}") from err
    rows = np.concatenate(kept).astype(np.int64) if kept else np.empty(0, dtype=np.int64)
    return len(rows), rows


def resolve_source(
    source: Any,
    *,
    columns: list[str] | None = None,
    filter: Any = None,
    version: int | None = None,
    storage_options: dict[str, str] | None = None,
) -> ResolvedSource:
    """Pin `source` to one version, check columns, and evaluate the filter once."""
    cols = tuple(columns) if columns is not None else None
    if isinstance(source, Path | str) and _looks_like_lance(str(source)):
        source = open_lance(str(source), version, storage_options)
    if _is_lancedb_table(source) or _is_lance_dataset(source):
        kind = "lancedb" if _is_lancedb_table(source) else "lance"
        base = source.to_lance() if kind == "lancedb" else source
        uri = base.uri
        pinned = version if version is not None else base.version
        dataset = open_lance(uri, pinned, storage_options)
        _check_columns(columns, dataset.schema.names, uri)
        n, rows = _lance_filtered(dataset, filter)
        name = source.name if kind == "lancedb" else None
        spec = SourceSpec(kind, uri, name, pinned, cols, None, storage_options)
        return ResolvedSource(spec, n, rows, filter)
    if isinstance(source, Path | str):
        source = pads.dataset(str(source), format="parquet")
    if isinstance(source, pa.Table):
        _check_columns(columns, source.column_names, "the Arrow table")
        n, rows = _arrow_filtered(source, filter)
        spec = SourceSpec(
            "arrow",
            "memory://arrow-table",
            None,
            None,
            cols,
            _table_fingerprint(source),
            data=source,
        )
        return ResolvedSource(spec, n, rows, None if filter is None else str(filter))
    if isinstance(source, pads.FileSystemDataset):
        _check_columns(columns, source.schema.names, "the Parquet dataset")
        n, rows = _arrow_filtered(source, filter)
        uri = os.path.commonpath(source.files) if source.files else ""
        spec = SourceSpec(
            "parquet", uri, None, None, cols, _files_fingerprint(source), data=tuple(source.files)
        )
        return ResolvedSource(spec, n, rows, None if filter is None else str(filter))
    raise TypeError(
        f"unsupported source {type(source).__name__}: pass a LanceDB table, a lance.LanceDataset, "
        f"a pyarrow.Table, a pyarrow.dataset.FileSystemDataset, or a path to Lance or Parquet"
    )
