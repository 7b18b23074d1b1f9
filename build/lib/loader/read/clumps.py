"""Whole-clump reads for packed tokens: read a clump of documents once, pack tasks from memory.

With a clump shuffle (`shuffle_clump_size` = C documents), table documents [j·C, (j+1)·C) are
consumed together and in order by one split, so a split's next blocks lie in its current
clump. Reading the documents task by task costs one `take` run per split and task, and a
`take` costs per run, not per byte; reading the clump once (one contiguous run) and packing
the next tasks from memory costs one run per clump. The batches are the same either way:
only how the same documents reach the packing kernel changes. Used where a run is a request
(object stores: 4x the tokens/s at S = 4, ~20x at S = 48 on a loopback S3 server); from a
local file Lance's sorted take of the same runs measured as fast, so it reads those.

The unit read is a clump, or a C-aligned piece of one when a clump holds more than the
budget (`unit_budget`); without shuffling (one clump of everything) it is such a piece.
Memory: a process keeps the 2·S_r + 2 units it used last (S_r: the rank's splits), each of
at most `UNIT_TOKENS` tokens and together `CACHE_TOKENS` on average (128 MiB of int32 ids),
plus the units of reads in flight. Read units only pay when a process packs several tasks from
each; with w DataLoader workers each sees every w-th task, so `pays` checks per task.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader.kernels.ragged import _ragged_take

UNIT_TOKENS = 1 << 20  # tokens of one read unit, at most (4 MiB of int32)
CACHE_TOKENS = 1 << 25  # tokens a process keeps in units, on average (128 MiB of int32)
MIN_REUSE = 2  # tasks a process should pack from a unit for whole-unit reads to pay

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

    def pays(self, tokens_per_doc: float, splits: int, task_tokens: int, workers: int) -> bool:
        """Whether this process packs at least MIN_REUSE tasks from each unit it reads."""
        return self.size * tokens_per_doc * splits >= MIN_REUSE * task_tokens * max(1, workers)


def unit_budget(splits: int) -> int:
    """Tokens per unit: UNIT_TOKENS, less when 2·S_r + 2 units would pass CACHE_TOKENS."""
    return min(UNIT_TOKENS, CACHE_TOKENS // (2 * splits + 2))


def read_units(
    clump: int, num_rows: int, tokens_per_doc: float, splits: int, shuffle: bool
) -> ReadUnits | None:
    """How to group positions for whole-unit reads, or None when a unit would be 1 document."""
    clump = clump if shuffle else num_rows  # no shuffle: the order is one clump, the identity
    size = min(clump, int(unit_budget(splits) // max(tokens_per_doc, 1.0)))
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
    ids = units.ids(positions)
    edges = np.flatnonzero(np.diff(ids)) + 1
    starts = np.concatenate(([0], edges)).tolist()
    stops = [*edges.tolist(), len(positions)]
    parts, lengths = [], []
    for a, b in zip(starts, stops, strict=True):
        unit = int(ids[a])
        values, offsets = loaded[unit]
        rows = positions[a:b] - units.span(unit)[0]
        first, last = int(rows[0]), int(rows[-1])
        if last - first + 1 == len(rows):  # consecutive documents: a slice, no copy here
            parts.append(values[offsets[first] : offsets[last + 1]])
            lengths.append(np.diff(offsets[first : last + 2]))
        else:
            taken, taken_offsets = _ragged_take(values, offsets, rows)
            parts.append(taken)
            lengths.append(np.diff(taken_offsets))
    out_offsets = np.zeros(len(positions) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lengths), out=out_offsets[1:])
    return np.concatenate(parts), out_offsets
