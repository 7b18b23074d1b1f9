"""One rank's batches from a position: pure arithmetic over per-split cursors.

Everything a rank yields for the rest of an epoch follows from the global cursor vector at
the start of an iteration, the rank, W, the batching and drop_last (`loader.layout` says
which layout applies). Batch t needs only the cursors after t steps (one `_advance`), so
DataLoader workers compute their own batches from a small task and nothing is shared
between processes.

A batch is always a set of runs, one per split it touches (a split's rows in a batch are
consecutive), read in the smallest-cursor-first order: by level, then split.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from loader.kernels.stream import _advance, _runs_order, _slice_runs, _task_order
from loader.layout import check_world_size, owned_splits, slice_bounds, uses_steps


@dataclass(frozen=True)
class Batching:
    """How a stream is cut: `batch_size` rows a rank (or a `global_batch` of all ranks'
    rows a step), and `drop_last` for the short final one."""

    batch_size: int | None
    drop_last: bool
    global_batch: int | None = None
    schedule: tuple[tuple[int, int], ...] = ()  # (global step, G): G from that step on

    def global_rows(self, world_size: int) -> int:
        """G: the rows of one full step on all ranks (the first G of a schedule)."""
        if self.global_batch is not None:
            return self.global_batch
        assert self.batch_size is not None
        return self.batch_size * world_size

    def rows_at(self, step: int, world_size: int) -> int:
        """G of global step `step`: the schedule's latest change at or before it, else G0."""
        rows = self.global_rows(world_size)
        for at, scheduled in self.schedule:
            if at > step:
                break
            rows = scheduled
        return rows

    def changes_after(self, step: int) -> tuple[tuple[int, int], ...]:
        """The schedule's changes after global step `step`, as (steps after it, G)."""
        return tuple((at - step, rows) for at, rows in self.schedule if at > step)


ROWS = Batching(1, False)  # iterating the dataset itself: every row is a "batch" of one


@dataclass(frozen=True, eq=False)
class BatchTask:
    """What a worker needs to read consecutive batches: self-contained, small, picklable.

    One task may cover several batches (`sizes`): they are read with one sorted read and
    handed out as slices. `runs` holds (split, first level, stop level) rows, `run_counts`
    how many of them each batch has.
    """

    epoch: int
    index: int  # of the first batch
    sizes: tuple[int, ...]  # rows of each batch
    runs: NDArray[np.int64]  # (R, 3)
    run_counts: tuple[int, ...]

    @property
    def count(self) -> int:
        return sum(self.sizes)

    @property
    def split_count(self) -> int:
        """How many splits the task's batches read from."""
        return len(np.unique(self.runs[:, 0]))


Runs = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]  # split, start, stop


def _task(epoch: int, index: int, sizes: list[int], runs: list[Runs]) -> BatchTask:
    stacked = [np.stack(r, axis=1) for r in runs]
    table = np.concatenate(stacked) if stacked else np.empty((0, 3), dtype=np.int64)
    return BatchTask(epoch, index, tuple(sizes), table, tuple(len(r) for r in stacked))


def task_order_indices(task: BatchTask, rows_per_split: int) -> NDArray[np.int64]:
    """Indices into the epoch order of a task's rows, in stream order (one kernel call)."""
    runs = np.ascontiguousarray(task.runs, dtype=np.int64).reshape(-1, 3)
    return _task_order(runs, np.asarray(task.run_counts, dtype=np.int64), rows_per_split)


def runs_order_indices(runs: Runs, rows_per_split: int) -> NDArray[np.int64]:
    """Indices into the epoch order (split * L + level) of one batch's runs, in the order
    the stream walks them (by level, then split)."""
    return _runs_order(runs[0], runs[1], runs[2], rows_per_split)


class RankStream:
    """The rest of one epoch on one rank, from global cursors `start`; what both layouts
    share. Every rank yields `num_batches` batches, so no collective waits on one that ran
    out; rows no rank will read this epoch on this world size are `skipped`."""

    epoch: int
    start: tuple[int, ...]
    rows_per_split: int
    rank: int
    world_size: int
    drop_last: bool
    rows: int  # this rank's
    num_batches: int
    skipped: int

    def task_rows(self, index: int) -> int:
        """Rows of this rank in batch `index` (the last one may be short)."""
        raise NotImplementedError

    def global_rows(self, index: int) -> int:
        """Rows of all ranks in step `index`: what a loss summed over it divides by."""
        raise NotImplementedError

    def cursors_after(self, batches: int) -> list[int]:
        """The global cursor vector once every rank has handed out `batches` batches."""
        raise NotImplementedError

    def _runs(self, index: int, count: int) -> list[Runs]:
        """The runs of batches [index, index + count)."""
        raise NotImplementedError

    def task(self, index: int, batches: int = 1) -> BatchTask:
        """Batches [index, index + batches) of this rank (0-based from the start of the stream)."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} is outside [0, {self.num_batches})")
        stop = min(index + batches, self.num_batches)
        sizes = [self.task_rows(t) for t in range(index, stop)]
        return _task(self.epoch, index, sizes, self._runs(index, stop - index))

    def tasks(self, batches_per_read: int) -> Iterator[BatchTask]:
        """The whole stream as tasks of `batches_per_read` batches (the last may be fewer)."""
        return (
            self.task(t, batches_per_read) for t in range(0, self.num_batches, batches_per_read)
        )

    @property
    def splits(self) -> range:
        raise NotImplementedError

    @property
    def cut(self) -> int:
        """How the stream is cut into batches: rows a rank a batch (split layout) or rows of
        all ranks a step (step layout); batches of two streams match when this and W do."""
        raise NotImplementedError


@dataclass(frozen=True)
class SplitStream(RankStream):
    """The split layout (W divides S): rank r streams its own splits round-robin, always
    the one with the smallest cursor, cut into batches of `batch_size` rows."""

    epoch: int
    start: tuple[int, ...]
    rows_per_split: int
    rank: int
    world_size: int
    batch_size: int
    drop_last: bool
    rows: int = field(init=False)
    num_batches: int = field(init=False)
    skipped: int = field(init=False)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        check_world_size(len(self.start), self.world_size)
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
        everything = len(self.start) * self.rows_per_split - sum(self.start)
        object.__setattr__(self, "skipped", everything - rows * self.world_size)

    @property
    def splits(self) -> range:
        return owned_splits(self.rank, self.world_size, len(self.start))

    @property
    def cut(self) -> int:
        return self.batch_size

    def _own_start(self, rank: int) -> NDArray[np.int64]:
        splits = owned_splits(rank, self.world_size, len(self.start))
        return np.asarray(self.start[splits.start : splits.stop], dtype=np.int64)

    def task_rows(self, index: int) -> int:
        return min(self.batch_size, self.rows - index * self.batch_size)

    def global_rows(self, index: int) -> int:
        return self.task_rows(index) * self.world_size

    def _runs(self, index: int, count: int) -> list[Runs]:
        length, first = self.rows_per_split, self.splits.start
        before = _advance(self._own_start(self.rank), index * self.batch_size, length)
        out: list[Runs] = []
        for t in range(index, index + count):
            after = _advance(before, self.task_rows(t), length)
            moved = np.flatnonzero(after > before).astype(np.int64)
            out.append((moved + first, before[moved], after[moved]))
            before = after
        return out

    def cursors_at(self, rows_done: int) -> list[int]:
        """The global cursor vector once every rank has handed out `rows_done` rows."""
        done = min(rows_done, self.rows)
        out: list[int] = []
        for rank in range(self.world_size):
            out.extend(_advance(self._own_start(rank), done, self.rows_per_split).tolist())
        return out

    def cursors_after(self, batches: int) -> list[int]:
        return self.cursors_at(batches * self.batch_size)


@dataclass(frozen=True)
class StepStream(RankStream):
    """The step layout (G a multiple of S, any W <= G): step t is the next G rows of the
    all-splits stream, laid out split-major; this rank takes its slice of every step.

    With a batch-size schedule G changes at given steps (`changes`: (steps after this
    stream's first, G)): the stream is cut into phases of constant G, each step still the
    next G rows, so step t is the same rows on every W. The last step of the epoch holds
    the rows left when fewer than its G remain (none with drop_last, or fewer than W)."""

    epoch: int
    start: tuple[int, ...]
    rows_per_split: int
    rank: int
    world_size: int
    global_batch: int
    drop_last: bool
    changes: tuple[tuple[int, int], ...] = ()
    rows: int = field(init=False)
    num_batches: int = field(init=False)
    skipped: int = field(init=False)
    _full: int = field(init=False, repr=False)  # steps of a full G
    _tail: int = field(init=False, repr=False)  # rows of the short last step (0: none)
    _phases: tuple[tuple[int, int, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for rows in (self.global_batch, *(g for _, g in self.changes)):
            check_world_size(len(self.start), self.world_size, rows)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Invalid rank {self.rank} for world_size={self.world_size}")
        left = len(self.start) * self.rows_per_split - sum(self.start)
        phases = []  # (first step, G, rows before it)
        index, used, rows = 0, 0, self.global_batch
        for at, scheduled in (*self.changes, (None, 0)):
            phases.append((index, rows, used))
            fit = (left - used) // rows
            if at is None or index + fit < at:
                index, used = index + fit, used + fit * rows
                break
            used += (at - index) * rows
            index, rows = at, scheduled
        tail = left - used
        if self.drop_last or tail < self.world_size:  # a rank would get no row: drop it
            tail = 0
        object.__setattr__(self, "_phases", tuple(phases))
        object.__setattr__(self, "_full", index)
        object.__setattr__(self, "_tail", tail)
        object.__setattr__(self, "num_batches", index + (tail > 0))
        object.__setattr__(self, "skipped", left - used - tail)
        mine = sum(
            (stop - first) * self._share(g)
            for (first, g, _), stop in zip(
                phases, [*(p[0] for p in phases[1:]), index], strict=True
            )
        )
        object.__setattr__(self, "rows", mine + (self._share(tail) if tail else 0))

    def _share(self, count: int) -> int:
        lo, hi = slice_bounds(self.rank, self.world_size, count)
        return hi - lo

    def _phase(self, index: int) -> tuple[int, int, int]:
        """(first step, G, rows before it) of the phase holding step `index`."""
        found = self._phases[0]
        for phase in self._phases:
            if phase[0] > index:
                break
            found = phase
        return found

    @property
    def splits(self) -> range:
        return owned_splits(self.rank, self.world_size, len(self.start), self.global_batch)

    @property
    def cut(self) -> int:
        return self.global_batch

    def global_rows(self, index: int) -> int:
        return self._phase(index)[1] if index < self._full else self._tail

    def task_rows(self, index: int) -> int:
        return self._share(self.global_rows(index))

    def _consumed(self, steps: int) -> int:
        if steps > self._full:
            return self._consumed(self._full) + self._tail
        first, rows, before = self._phase(steps)
        return before + (steps - first) * rows

    def cursors_after(self, batches: int) -> list[int]:
        start = np.asarray(self.start, dtype=np.int64)
        return _advance(start, self._consumed(batches), self.rows_per_split).tolist()

    def _runs(self, index: int, count: int) -> list[Runs]:
        length = self.rows_per_split
        before = _advance(np.asarray(self.start, dtype=np.int64), self._consumed(index), length)
        out: list[Runs] = []
        for t in range(index, index + count):
            n = self.global_rows(t)
            after = _advance(before, n, length)
            lo, hi = slice_bounds(self.rank, self.world_size, n)
            out.append(_slice_runs(before, after, lo, hi))
            before = after
        return out


def rank_stream(
    epoch: int,
    start: tuple[int, ...],
    rows_per_split: int,
    rank: int,
    world_size: int,
    batching: Batching,
    first_step: int = 0,
) -> RankStream:
    """The stream of the layout that applies (`loader.layout`); `first_step` is the global
    step of its first batch (what a batch-size schedule is counted in)."""
    global_batch = batching.rows_at(first_step, world_size)
    if uses_steps(len(start), global_batch):
        changes = batching.changes_after(first_step)
        return StepStream(
            epoch,
            start,
            rows_per_split,
            rank,
            world_size,
            global_batch,
            batching.drop_last,
            changes,
        )
    check_world_size(len(start), world_size, global_batch)
    return SplitStream(
        epoch,
        start,
        rows_per_split,
        rank,
        world_size,
        global_batch // world_size,
        batching.drop_last,
    )
