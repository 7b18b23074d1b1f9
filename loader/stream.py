"""One rank's batches from a position: pure arithmetic over per-split cursors.

Everything a rank yields for the rest of an epoch follows from the global cursor vector at
the start of an iteration, the rank, W, b and drop_last. Batch t needs only the cursors
after t*b rows (one `_advance`), so DataLoader workers compute their own batches from a
small task and nothing is shared between processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from loader.kernels.stream import _advance, _stream_take
from loader.layout import owned_splits


@dataclass(frozen=True)
class BatchTask:
    """What a worker needs to read consecutive batches: self-contained, small, picklable.

    One task may cover several batches (`sizes`): they are read with one sorted read, in
    which each split's rows are one run, and handed out as slices.
    """

    epoch: int
    index: int  # of the first batch
    first_split: int
    cursors: tuple[int, ...]  # of the rank's splits, before the first batch
    sizes: tuple[int, ...]  # rows of each batch

    @property
    def count(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class RankStream:
    """The rest of one epoch on one rank, from global cursors `start`.

    Every rank yields `rows` rows: the fewest any rank has left, so no collective waits on
    a rank that ran out (the rest are skipped for this epoch and reported as `skipped`).
    """

    epoch: int
    start: tuple[int, ...]
    rows_per_split: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    rows: int = field(init=False)
    num_batches: int = field(init=False)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        cursors = np.asarray(self.start, dtype=np.int64)
        per_rank = cursors.reshape(self.world_size, -1)  # (W, S/W): a row per rank
        left = (self.rows_per_split - per_rank).sum(axis=1)
        rows = int(left.min())
        if self.drop_last:
            batches = rows // self.batch_size
            rows = batches * self.batch_size
        else:
            batches = -(-rows // self.batch_size)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "num_batches", batches)

    @property
    def splits(self) -> range:
        return owned_splits(self.rank, self.world_size, len(self.start))

    @property
    def skipped(self) -> int:
        """Rows of this epoch that no rank will read from here on this world size."""
        left = len(self.start) * self.rows_per_split - sum(self.start)
        return left - self.rows * self.world_size

    def _own_start(self, rank: int) -> NDArray[np.int64]:
        splits = owned_splits(rank, self.world_size, len(self.start))
        return np.asarray(self.start[splits.start : splits.stop], dtype=np.int64)

    def task_rows(self, index: int) -> int:
        """Rows in batch `index` (the last one may be short)."""
        return min(self.batch_size, self.rows - index * self.batch_size)

    def task(self, index: int, batches: int = 1) -> BatchTask:
        """Batches [index, index + batches) of this rank (0-based from the start of the stream)."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} is outside [0, {self.num_batches})")
        done = index * self.batch_size
        cursors = _advance(self._own_start(self.rank), done, self.rows_per_split)
        stop = min(index + batches, self.num_batches)
        sizes = tuple(self.task_rows(t) for t in range(index, stop))
        return BatchTask(self.epoch, index, self.splits.start, tuple(cursors.tolist()), sizes)

    def tasks(self, batches_per_read: int) -> Iterator[BatchTask]:
        """The whole stream as tasks of `batches_per_read` batches (the last may be fewer)."""
        return (
            self.task(t, batches_per_read) for t in range(0, self.num_batches, batches_per_read)
        )

    def cursors_at(self, rows_done: int) -> list[int]:
        """The global cursor vector once every rank has handed out `rows_done` rows."""
        done = min(rows_done, self.rows)
        out: list[int] = []
        for rank in range(self.world_size):
            out.extend(_advance(self._own_start(rank), done, self.rows_per_split).tolist())
        return out


def task_order_indices(task: BatchTask, rows_per_split: int) -> NDArray[np.int64]:
    """Indices into the epoch order of a task's rows, in stream order."""
    cursors = np.asarray(task.cursors, dtype=np.int64)
    splits, levels = _stream_take(cursors, task.count, rows_per_split)
    return (splits + task.first_split) * rows_per_split + levels
