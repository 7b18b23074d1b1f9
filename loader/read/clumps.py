"""Whole-clump reads: read a clump once, serve the tasks that draw from it from memory.

With a clump shuffle (`shuffle_clump_size` = C rows or documents), table positions
[j·C, (j+1)·C) are consumed together and in order by one split, so a split's next rows lie
in its current clump. Reading task by task costs one `take` run per split and task, and a
`take` costs per run, not per byte; reading the clump once (one contiguous run) and serving
the next tasks from memory costs one run per clump. The batches are the same either way:
only how the same rows reach the conversion (or the packing kernel) changes.

Where it is used, as measured (benchmarks/README.md, issue #21):
- packed tokens on object stores, where a run is a request (4x the tokens/s at S = 4, ~20x
  at S = 48 on a loopback S3 server); from a local file Lance's sorted take of the same runs
  measured as fast, so packing reads those locally;
- fixed-width rows from a local Lance table: one `take` of a contiguous range per clump
  (Lance's contiguous path) instead of one multi-run take per read (~1.8x faster takes).

The unit read is a clump, or a C-aligned piece of one when a clump holds more than the
budget (`unit_budget`); without shuffling (one clump of everything) it is such a piece.
Memory: a process keeps the 2·S_r + 2 units it used last (S_r: the rank's splits), each of
at most `UNIT_BYTES` and together `CACHE_BYTES` on average (128 MiB), plus the units of
reads in flight: about (2·S_r + 2) × C × row bytes. Units only pay when a process serves
several tasks from each; with w DataLoader workers each sees every w-th task, so `pays`
checks per task.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loader.kernels.ragged import _ragged_take

UNIT_BYTES = 4 << 20  # bytes of one read unit, at most
CACHE_BYTES = 128 << 20  # bytes a process keeps in units, on average
TOKEN_BYTES = 4  # what a token of a packed unit is counted as (an int32 id)
MIN_REUSE = 2  # tasks a process should serve from a unit for whole-unit reads to pay

Docs = tuple[NDArray[Any], NDArray[np.int64]]  # documents as (values, offsets from 0)


@dataclass(frozen=True)
class ReadUnits:
    """Plan positions grouped into read units: pieces of `size` documents, aligned to the
    start of each clump of `clump` (the last clump of the table may be short)."""

    clump: int
    size: int
    num_rows: int

    @property
    def pieces(self) -> int:
        return -(-self.clump // self.size)

    def ids(self, positions: NDArray[np.int64]) -> NDArray[np.int64]:
        """The unit of each plan position (ascending with the position)."""
        clump, rest = np.divmod(positions, self.clump)
        return clump * self.pieces + rest // self.size

    def span(self, unit: int) -> tuple[int, int]:
        """[start, stop) plan positions of a unit."""
        clump, piece = divmod(unit, self.pieces)
        start = clump * self.clump + piece * self.size
        return start, min(start + self.size, (clump + 1) * self.clump, self.num_rows)

    def pays(self, per_row: float, splits: int, task_amount: int, workers: int) -> bool:
        """Whether this process serves at least MIN_REUSE tasks from each unit it reads
        (`per_row` and `task_amount` in one measure: rows, or tokens)."""
        return self.size * per_row * splits >= MIN_REUSE * task_amount * max(1, workers)

    def runs(self, positions: NDArray[np.int64]) -> list[tuple[int, int, int, int, bool]]:
        """(unit, a, b, first, whole), one a unit: ascending `positions[a:b]` lie in `unit`
        from its row `first` on, and `whole` says they are consecutive rows."""
        if not len(positions):
            return []
        ids = self.ids(positions)
        edges = np.flatnonzero(ids[1:] != ids[:-1]) + 1
        a, b = np.concatenate(([0], edges)), np.append(edges, len(positions))
        unit = ids[a]
        clump, piece = np.divmod(unit, self.pieces)
        first = positions[a] - (clump * self.clump + piece * self.size)
        whole = positions[b - 1] - positions[a] == b - a - 1
        bounds = (a.tolist(), b.tolist(), first.tolist(), whole.tolist())
        return list(zip(unit.tolist(), *bounds, strict=True))


def contiguous_ranges(positions: NDArray[np.int64]) -> list[tuple[int, int]]:
    """Ascending unique `positions` as [start, stop) ranges of consecutive ones."""
    edges = np.flatnonzero(np.diff(positions) != 1) + 1
    a, b = np.concatenate(([0], edges)), np.append(edges, len(positions))
    return list(zip(positions[a].tolist(), (positions[b - 1] + 1).tolist(), strict=True))


def unit_budget(splits: int) -> int:
    """Bytes per unit: UNIT_BYTES, less when 2·S_r + 2 units would pass CACHE_BYTES."""
    return min(UNIT_BYTES, CACHE_BYTES // (2 * splits + 2))


def read_units(
    clump: int, num_rows: int, row_bytes: float, splits: int, shuffle: bool
) -> ReadUnits | None:
    """How to group positions for whole-unit reads (rows of `row_bytes` each, on average),
    or None when a unit would be one row."""
    clump = clump if shuffle else num_rows  # no shuffle: the order is one clump, the identity
    size = min(clump, int(unit_budget(splits) // max(row_bytes, float(TOKEN_BYTES))))
    return ReadUnits(clump, size, num_rows) if size >= 2 else None


class UnitCache:
    """The units this process read last, shared by its read threads; each is read once
    (a thread that needs a unit another is reading waits for that read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._units: OrderedDict[int, Future[Docs]] = OrderedDict()

    def get(
        self,
        wanted: list[int],
        read: Callable[[list[int]], list[Docs]],
        capacity: int,
    ) -> list[Docs]:
        """Read units `wanted` (values, offsets), reading the missing ones with one `read`."""
        futures, mine = [], {}
        with self._lock:
            for unit in wanted:
                future = self._units.get(unit)
                if future is None:
                    future = mine[unit] = self._units[unit] = Future()
                else:
                    self._units.move_to_end(unit)
                futures.append(future)
            while len(self._units) > capacity:  # a task holds what it took; only the index goes
                self._units.popitem(last=False)
        if mine:
            try:
                got = read(list(mine))
            except BaseException as err:  # every waiter sees the error; a later task re-reads
                with self._lock:
                    for unit, future in mine.items():
                        if self._units.get(unit) is future:
                            del self._units[unit]
                for future in mine.values():
                    future.set_exception(err)
                raise
            for future, part in zip(mine.values(), got, strict=True):
                future.set_result(part)
        return [future.result() for future in futures]


def split_units(values: NDArray[Any], offsets: NDArray[np.int64], counts: list[int]) -> list[Docs]:
    """One read of consecutive units cut into one (values, offsets) per unit (views)."""
    out, row = [], 0
    for count in counts:
        first, last = int(offsets[row]), int(offsets[row + count])
        out.append((values[first:last], offsets[row : row + count + 1] - first))
        row += count
    return out


def gather(
    units: ReadUnits, positions: NDArray[np.int64], loaded: dict[int, Docs]
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """The documents at ascending plan `positions`, in that order, from their loaded units."""
    parts, lengths = [], []
    for unit, a, b, first, whole in units.runs(positions):
        values, offsets = loaded[unit]
        if whole:  # consecutive documents: a slice, no copy here
            last = first + b - a
            parts.append(values[offsets[first] : offsets[last]])
            lengths.append(np.diff(offsets[first : last + 1]))
        else:
            rows = positions[a:b] - (positions[a] - first)
            taken, taken_offsets = _ragged_take(values, offsets, rows)
            parts.append(taken)
            lengths.append(np.diff(taken_offsets))
    out_offsets = np.zeros(len(positions) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lengths), out=out_offsets[1:])
    return np.concatenate(parts), out_offsets


def gather_rows(
    runs: list[tuple[int, int, int, int, bool]],
    positions: NDArray[np.int64],
    loaded: dict[int, pa.Table],
) -> pa.Table:
    """The rows at ascending plan `positions`, in that order, from their loaded units by
    their `runs` (`ReadUnits.runs`): one chunk a run, consecutive rows sliced (no copy)."""
    parts = []
    for unit, a, b, first, whole in runs:
        if whole:
            parts.append(loaded[unit].slice(first, b - a))
        else:
            parts.append(loaded[unit].take(pa.array(positions[a:b] - (positions[a] - first))))
    return pa.concat_tables(parts)
