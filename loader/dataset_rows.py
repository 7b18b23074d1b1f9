"""Iterating a StreamingDataset directly: rows (or packed blocks) one by one.

The loader reads whole batches; this is the plain `IterableDataset` path, for code that
iterates the dataset itself. Reads are `ROW_READ_SIZE` rows at a time; inside DataLoader
workers each worker takes every w-th read, so the union is every row once (the order then
depends on w: use StreamingDataLoader for one that does not). Only the main process moves the
position, one row (or block) as it reaches the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from loader.progress import Batching, Progress

ROW_READ_SIZE = 1024  # rows per read when iterating the dataset row by row


def rows_of(
    progress: Progress, reader: Any, by_row: Batching, info: Any
) -> Iterator[dict[str, Any]]:
    """The remaining rows of the epoch, transformed (`info`: the DataLoader worker's, or None)."""
    stream = progress.start(by_row) if info is None else progress.peek(by_row)
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)

    def recorded() -> None:  # a row reached the caller (or was skipped by on_error)
        progress.record(stream)

    for first in range(worker * ROW_READ_SIZE, stream.num_batches, workers * ROW_READ_SIZE):
        task = stream.task(first, ROW_READ_SIZE)  # a batch is a row: one read of 1024
        table, restore = reader.read(reader.positions(task))
        rows = table.take(pa.array(restore)).to_pylist()
        yield from reader.transformed(rows, on_each=None if info else recorded)


def blocks_of(
    progress: Progress, reader: Any, by_row: Batching, info: Any
) -> Iterator[dict[str, Any]]:
    """Packed blocks one by one (each a dict of (seq_len,) tensors and its cu_seqlens)."""
    stream = progress.start(by_row) if info is None else progress.peek(by_row)
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    for first in range(worker * ROW_READ_SIZE, stream.num_batches, workers * ROW_READ_SIZE):
        for batch in reader[stream.task(first, ROW_READ_SIZE)]:
            if info is None:
                progress.record(stream)
            yield {k: v if k == "cu_seqlens" else v[0] for k, v in batch.items()}
