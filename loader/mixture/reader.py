"""Reading a mixture's task: one read per (dataset, pass) through that dataset's own
reader (as few takes as a dataset alone), then every row (or block) placed where the step's
interleaved layout puts it, with its `source`. Plain numeric rows are copied once, straight
into place (`loader.kernels.rows`); other batches are joined dataset by dataset and then
reordered by one index per column."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from numpy.typing import NDArray

from loader.kernels.rows import _place_rows
from loader.mixture.columns import SOURCE_FIELD, check_pieces
from loader.mixture.stream import MixTask
from loader.read.convert import (
    Ragged,
    column_to_numpy,
    null_count,
    one_buffer,
    single_array,
    table_to_batch,
)
from loader.read.reader import BatchReader, SlicedRead, cut_columns
from loader.stream import task_order_indices

__all__ = ["SOURCE_FIELD", "MixReader", "join_batches"]


class MixReader:
    """Reads a MixTask: one read per (dataset, pass) through that dataset's own reader, then
    each batch joined in layout order with its `source` tensor."""

    def __init__(self, readers: Sequence[Any]) -> None:
        self.readers = tuple(readers)

    def batches(self, task: MixTask, sub_reads: int = 1) -> Sequence[Any]:
        rows = all(
            type(self.readers[k]) is BatchReader and not self.readers[k].transform
            for k, _ in task.groups
        )
        if rows:  # plain rows: numeric columns copied once, straight into place
            placement, kept = Placement(task), {}
            for g in range(len(task.groups)):
                read = self._read(task, g, sub_reads)
                placement.add(*read)  # while the read is fresh in the cache
                if placement.failed:
                    kept[g] = read
                del read  # placed, dropped before the next take: one held at a time, not K
                # (benchmarks/README.md: a fifth fewer fresh pages faulted in an epoch)
            if placement.complete:
                return placement.batches()
            reads = [  # the groups placed before the placement failed: read again
                kept[g] if g in kept else self._read(task, g, sub_reads)
                for g in range(len(task.groups))
            ]
            parts = [
                _split(table_to_batch(table, order), t.sizes)
                for (table, order), (_, t) in zip(reads, task.groups, strict=True)
            ]
        else:
            parts = [self.readers[k].batches(t, sub_reads) for k, t in task.groups]
        out = []
        interleaving = task.interleaving()
        at = 0
        for items, size in zip(task.layout, task.sizes, strict=True):
            pieces = [parts[g][i] for g, i in items]
            sources = [task.groups[g][0] for g, _ in items]
            counts = [task.groups[g][1].sizes[i] for g, i in items]
            joined = join_batches(pieces, sources, counts)
            out.append(reorder(joined, interleaving[at : at + size] - at))
            at += size
        return out

    def __getitem__(self, task: MixTask) -> Sequence[Any]:
        return self.batches(task)

    def _read(
        self, task: MixTask, group: int, sub_reads: int
    ) -> tuple[pa.Table, NDArray[np.int64]]:
        """A group's rows in one read (`BatchReader.read`: ascending, and the order back)."""
        return self.readers[task.groups[group][0]].read(self._positions(task, group), sub_reads)

    def _positions(self, task: MixTask, group: int) -> NDArray[np.int64]:
        """Table positions of a group's rows in stream order; of a group of whole passes,
        each pass in its own epoch's order, end to end (one kernel call)."""
        k, t = task.groups[group]
        reader, passes = self.readers[k], task.passes_of(group)
        if passes == 1:
            return reader.positions(t)
        order_idx = task_order_indices(t, reader.plan.rows_per_split)
        positions = reader.plan.epoch(t.epoch).order_of_passes(passes, order_idx)
        rows = reader.source.rows
        return positions if rows is None else rows[positions]


def _split(whole: dict[str, Any], sizes: tuple[int, ...]) -> SlicedRead:
    """A read's batches as views of its whole columns (what a worker hands on whole)."""
    return SlicedRead(whole, np.cumsum((0, *sizes)).tolist(), cut_columns)


def _numeric_columns(table: pa.Table) -> dict[str, NDArray[Any]] | None:
    """A read's columns as NumPy views, or None when one is not numeric or has nulls."""
    columns = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        array = single_array(column)
        values = column_to_numpy(array) if null_count(array) == 0 else None
        if values is None:
            return None
        columns[name] = values
    return columns


class Placement:
    """A task's batches as slices of one buffer (`one_buffer`, as a single dataset's read),
    each read's rows copied straight into their places as soon as it is read (while it is
    still in the cache), one kernel call per (column, read). Incomplete when a column is
    not numeric, has nulls, or differs in name, type or width between datasets (then the
    general join, which also names the problem)."""

    def __init__(self, task: MixTask) -> None:
        self.task = task
        self.places = task.places()
        self.outs: dict[str, torch.Tensor] | None = None
        self.placed = 0  # reads placed, in group order
        self.failed = False

    @property
    def complete(self) -> bool:
        return not self.failed and self.placed == len(self.task.groups)

    def add(self, table: pa.Table, order: NDArray[np.int64]) -> None:
        """Place the next group's read (rows in ascending position order, `order` restoring
        the group's stream order); groups come in order."""
        if self.failed:
            return
        group = self.placed
        columns = _numeric_columns(table)
        outs = self.outs
        if columns is not None and outs is None:
            kinds = {**columns, SOURCE_FIELD: np.empty(0, np.int64)}
            outs = self.outs = one_buffer(kinds, sum(self.task.sizes))
        if columns is None or outs is None or not _fits(columns, outs):
            self.failed = True
            return
        at = self.places[group]
        for name, values in columns.items():
            _place_rows(_as_words(values), order, _as_words(outs[name].numpy()), at)
        outs[SOURCE_FIELD].numpy()[at] = self.task.groups[group][0]
        self.placed += 1

    def batches(self) -> SlicedRead:
        assert self.outs is not None and self.complete
        return _split(self.outs, self.task.sizes)


def _fits(columns: dict[str, NDArray[Any]], outs: dict[str, torch.Tensor]) -> bool:
    """Whether a read's columns are the buffer's (names in order, dtypes, row shapes)."""
    if list(columns) != [name for name in outs if name != SOURCE_FIELD]:
        return False
    for name, values in columns.items():
        out = outs[name].numpy()
        if values.dtype != out.dtype or values.shape[1:] != out.shape[1:]:
            return False
    return True


def _as_words(values: NDArray[Any]) -> NDArray[Any]:
    """A column's rows as (rows, words a row) of the widest unsigned word that divides a
    row's bytes (a view): a copy by 8-byte words runs ~2x faster than by bytes on narrow
    columns, and four signatures serve every dtype and width."""
    values = np.ascontiguousarray(values)
    row_bytes = values.itemsize * math.prod(values.shape[1:])
    word = next(w for w in (8, 4, 2, 1) if row_bytes % w == 0)
    return values.reshape(len(values), row_bytes // values.itemsize).view(f"u{word}")


def join_batches(pieces: list[Any], sources: list[int], counts: list[int]) -> dict[str, Any]:
    """One batch from pieces of several datasets (same keys), plus the `source` of each row."""
    for piece in pieces:
        if not isinstance(piece, dict):
            raise TypeError(
                f"a mixture's datasets must give dict batches, got {type(piece).__name__}"
            )
    check_pieces(pieces)
    out: dict[str, Any] = {}
    for key in pieces[0]:
        values = [p[key] for p in pieces]
        out[key] = values[0] if len(values) == 1 else _join(key, values)
    out[SOURCE_FIELD] = torch.repeat_interleave(torch.tensor(sources), torch.tensor(counts))
    return out


def _join(key: str, values: list[Any]) -> Any:
    if key == "cu_seqlens":  # packed: boundaries in each piece's flattened blocks
        shifted, total = [], 0
        for v in values:
            shifted.append(v[:-1] + total)
            total += int(v[-1])
        return torch.cat([*shifted, torch.tensor([total], dtype=values[0].dtype)])
    if isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    if isinstance(values[0], Ragged):
        starts = np.cumsum([0] + [int(v.offsets[-1]) for v in values[:-1]]).tolist()
        offsets = [values[0].offsets[:1]] + [
            v.offsets[1:] + s for v, s in zip(values, starts, strict=True)
        ]
        return Ragged(torch.cat([v.values for v in values]), torch.cat(offsets))
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    raise TypeError(f"column {key!r}: cannot join values of type {type(values[0]).__name__}")


def reorder(batch: dict[str, Any], rows: NDArray[np.int64]) -> dict[str, Any]:
    """`batch` (rows or packed blocks grouped by dataset) with row i taken from row rows[i]:
    the interleaved layout. A no-op when the rows are in order already (one dataset)."""
    if np.array_equal(rows, np.arange(len(rows))):
        return batch
    index = torch.from_numpy(rows)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key == "cu_seqlens":
            out[key] = _reorder_boundaries(value, rows, batch["input_ids"].shape[1])
        elif isinstance(value, torch.Tensor):
            out[key] = value[index]
        elif isinstance(value, Ragged):
            out[key] = _reorder_ragged(value, rows)
        elif isinstance(value, list):
            out[key] = [value[i] for i in rows.tolist()]
        else:
            raise TypeError(f"column {key!r}: cannot reorder values of type {type(value).__name__}")
    return out


def _reorder_boundaries(cu: torch.Tensor, rows: NDArray[np.int64], seq_len: int) -> torch.Tensor:
    """A packed batch's `cu_seqlens` after its blocks are reordered: every block's
    boundaries (a block's start is always one) move with it."""
    values = cu.numpy().astype(np.int64)
    inner = values[:-1]
    old = inner // seq_len
    new = np.empty_like(rows)
    new[rows] = np.arange(len(rows), dtype=np.int64)
    moved = np.sort(inner + (new[old] - old) * seq_len)
    return torch.from_numpy(np.append(moved, values[-1]).astype(values.dtype, copy=False)).to(
        cu.dtype
    )


def _reorder_ragged(value: Ragged, rows: NDArray[np.int64]) -> Ragged:
    offsets = value.offsets.numpy().astype(np.int64)
    lengths = np.diff(offsets)[rows]
    starts = offsets[:-1][rows]
    new_offsets = np.concatenate(([0], np.cumsum(lengths)))
    flat = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(int(new_offsets[-1]))
    return Ragged(
        value.values[torch.from_numpy(flat)], torch.from_numpy(new_offsets).to(value.offsets.dtype)
    )
