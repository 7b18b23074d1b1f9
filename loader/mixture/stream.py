"""A mixture's batches on one rank: tasks for the loader's sampler and the progress it records.

`MixStream` and `MixProgress` have the interface the loader uses for a single dataset's
`RankStream` and `Progress` (start, peek, record; tasks, num_batches, global_rows), over a
`MixPosition` instead of one dataset's cursors. Each step is computed from the position by
`loader.mixture.plan`: nothing is replayed, nothing shared with workers but the tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader.layout import slice_bounds
from loader.mixture.plan import MixPlan, MixPosition, Piece
from loader.progress import Batching
from loader.skips import SkipRanges
from loader.stream import BatchTask
from loader.world import World


@dataclass(frozen=True, eq=False)
class MixTask:
    """Consecutive steps of one rank: a `BatchTask` per (dataset, pass) they touch, for
    every batch which of those tasks' batches it joins (source order), and the layout:
    the dataset of every row of the batches end to end (interleaved, the row sequence's
    order)."""

    epoch: int
    index: int
    sizes: tuple[int, ...]
    groups: tuple[tuple[int, BatchTask], ...]  # (dataset, its task)
    layout: tuple[tuple[tuple[int, int], ...], ...]  # per batch: (group, batch in group)
    labels: NDArray[np.int64]  # per row of the batches end to end: its dataset
    passes: tuple[int, ...] = ()  # per group: whole passes from its task's epoch (1: one pass)

    def passes_of(self, group: int) -> int:
        return self.passes[group] if self.passes else 1

    def places(self) -> list[NDArray[np.int64]]:
        """Per group, the row of the batches (end to end) that each row of its read (in the
        group's stream order) goes to: a dataset's rows fill the rows the layout gives it,
        in order, its passes one after another (groups of a dataset come in pass order)."""
        rows: dict[int, NDArray[np.int64]] = {}  # per dataset: the rows the layout gives it
        start: dict[int, int] = {}
        out = []
        for k, task in self.groups:
            if k not in rows:
                rows[k], start[k] = np.flatnonzero(self.labels == k), 0
            out.append(rows[k][start[k] : start[k] + task.count])
            start[k] += task.count
        return out

    def interleaving(self) -> NDArray[np.int64]:
        """For each row of the batches, its row among the batches' rows grouped dataset by
        dataset (each batch: its pieces in `layout` order): what reorders a joined batch."""
        out = np.empty(len(self.labels), dtype=np.int64)
        at = 0
        for size in self.sizes:
            labels = self.labels[at : at + size]
            order = np.argsort(labels, kind="stable")
            out[at + order] = np.arange(at, at + size, dtype=np.int64)
            at += size
        return out


def _mix_task(
    epoch: int,
    index: int,
    steps: list[tuple[list[Piece], NDArray[np.int64]]],
    sizes: tuple[int, ...],
) -> MixTask:
    keys: dict[tuple[int, int, int], int] = {}
    parts: list[list[Piece]] = []
    layout = []
    for pieces, _ in steps:
        items = []
        for piece in pieces:
            group = keys.setdefault((piece.source, piece.epoch, piece.passes), len(parts))
            if group == len(parts):
                parts.append([])
            items.append((group, len(parts[group])))
            parts[group].append(piece)
        layout.append(tuple(items))
    groups = []
    for (source, pass_, _), pieces in zip(keys, parts, strict=True):
        runs = np.stack([np.concatenate([p.runs[c] for p in pieces]) for c in range(3)], axis=1)
        counts = tuple(len(p.runs[0]) for p in pieces)
        task = BatchTask(pass_, index, tuple(p.count for p in pieces), runs, counts)
        groups.append((source, task))
    labels = np.concatenate([lay for _, lay in steps]) if steps else np.empty(0, np.int64)
    passes = tuple(passes for _, _, passes in keys)
    return MixTask(epoch, index, sizes, tuple(groups), tuple(layout), labels, passes)


class MixStream:
    """The rest of a mixture epoch on one rank from a position: every step G rows, this
    rank's slice [r*G//W, (r+1)*G//W) of each (the loader's stream interface). With a batch
    schedule (`changes`: (global step, G) from which G changes) each step has its own G."""

    def __init__(
        self,
        plan: MixPlan,
        start: MixPosition,
        world: World,
        global_batch: int,
        changes: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.plan, self.start, self.global_batch = plan, start, global_batch
        self.changes = tuple((at, g) for at, g in changes if at > start.global_step)
        self.epoch = start.epoch
        self.rank, self.world_size = world.rank, world.world_size
        self.num_batches = self._steps_left()
        self.after: dict[int, MixPosition] = {}  # positions after steps the tasks walked
        self._walked = (0, start)  # (steps, position) where the last task ended

    def _steps_left(self) -> int:
        """Steps to the epoch's end: per phase of one G, until the epoch ends inside one."""
        pos, done = self.start, 0
        for at, _ in self.changes:
            rows = self.global_rows(done)
            left = self.plan.steps_left(pos, rows)
            if left <= at - pos.global_step:
                return done + left
            while pos.global_step < at:  # a whole phase inside the epoch
                pos, _ = self.plan.step(pos, rows)
                done += 1
        return done + self.plan.steps_left(pos, self.global_rows(done))

    def global_rows(self, index: int) -> int:
        """G of batch `index` (of global step start + index)."""
        rows = self.global_batch
        for at, scheduled in self.changes:
            if at > self.start.global_step + index:
                break
            rows = scheduled
        return rows

    def read_ahead_to(self) -> int:
        """The global step after the last one a task was made for (handed to a reader)."""
        walked, pos = self._walked
        return pos.global_step if walked else self.start.global_step

    def replan(self, plan: MixPlan) -> None:
        """Go on with `plan` (new weights from a step not yet read): the steps not yet made
        into tasks, and where the epoch ends, come from it."""
        walked, _ = self._walked
        self.plan = plan
        if walked < self.num_batches:  # the steps made so far are the same under `plan`
            self.num_batches = self._steps_left()

    def task_rows(self, index: int) -> int:
        lo, hi = slice_bounds(self.rank, self.world_size, self.global_rows(index))
        return hi - lo

    def task(self, index: int, batches: int = 1) -> MixTask:
        """Steps [index, index + batches) of this rank. Asked in order (the loader walks the
        stream), each is one step on from the last; another index walks from the start."""
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch {index} is outside [0, {self.num_batches})")
        walked, pos = self._walked
        if walked > index:
            walked, pos = 0, self.start
        while walked < index:
            pos, _ = self.plan.step(pos, self.global_rows(walked))
            walked += 1
        steps = []
        stop = min(index + batches, self.num_batches)
        for at in range(index, stop):
            rows = self.global_rows(at)
            lo, hi = slice_bounds(self.rank, self.world_size, rows)
            pos, pieces, layout = self.plan.rank_step(pos, rows, lo, hi)
            self.after[at] = pos  # `record` takes it instead of stepping again
            steps.append((pieces, layout))
        self._walked = (index + len(steps), pos)
        sizes = tuple(self.task_rows(at) for at in range(index, stop))
        return _mix_task(self.epoch, index, steps, sizes)

    def tasks(self, batches_per_read: int) -> Iterator[MixTask]:
        """The whole stream as tasks of `batches_per_read` steps (the last may be fewer)."""
        return (
            self.task(t, batches_per_read) for t in range(0, self.num_batches, batches_per_read)
        )


class MixProgress:
    """Where the mixture is: the position after the steps handed to the training loop (the
    loader's progress interface, as `loader.progress.Progress`: start, peek, record, step,
    global_step, epoch, ended, position, skips). Batches are recorded in order."""

    def __init__(self, mixture: Any, position: MixPosition) -> None:  # a MixedDataset
        self._mixture = mixture
        self._pos = position
        self._stream: MixStream | None = None
        self._done = 0  # steps of `_stream` recorded
        self._batch_epoch = position.epoch
        self.step = position.step
        self.skips = SkipRanges()  # global steps [start, stop) to jump over
        self.steps_skipped: list[list[int]] = []  # [first, stop) global steps jumped

    @property
    def world(self) -> World:
        return self._mixture.world

    @property
    def epoch(self) -> int:
        """The epoch of the batch in hand (after an epoch's last batch, still that epoch)."""
        return self._batch_epoch

    @property
    def global_step(self) -> int:
        return self._pos.global_step

    @property
    def ended(self) -> bool:
        """Whether the batch in hand was its epoch's last (the next comes from epoch + 1)."""
        stream = self._stream
        return stream is not None and self._done >= stream.num_batches

    def position(self) -> tuple[int, tuple[int, ...], int]:
        """(epoch, (), step) of the next batch, as `Progress.position` (the mixture's own
        position, per dataset, is `mix_position`)."""
        return self._pos.epoch, (), self._pos.step

    def mix_position(self) -> MixPosition:
        return self._pos

    def move(self, position: MixPosition) -> None:
        self._pos, self._stream, self._done = position, None, 0
        self._batch_epoch, self.step = position.epoch, position.step

    def peek(self, batching: Batching) -> MixStream:
        g = batching.rows_at(self._pos.global_step, self.world.world_size)
        return MixStream(self._mixture.mix_plan, self._pos, self.world, g, batching.schedule)

    def start(self, batching: Batching) -> MixStream:
        self.move(self._pos)
        stream = self.peek(batching)
        self._stream = stream
        if stream.num_batches == 0:  # nothing left of this epoch: the next one
            passes = tuple(s.epoch for s in self._pos.sources)
            self.move(replace(self._pos, epoch=self._pos.epoch + 1, step=0, epoch_passes=passes))
        return stream

    def read_ahead_to(self) -> int:
        """The global step after the last one read (or being read) ahead: set_weights may
        begin a phase there or later, not before."""
        stream = self._stream
        reached = self._pos.global_step
        return max(reached, stream.read_ahead_to()) if stream is not None else reached

    def replan(self, plan: Any) -> None:
        if self._stream is not None:
            self._stream.replan(plan)

    def is_current(self, stream: Any) -> bool:
        return stream is self._stream

    def handed_out(self, index: int) -> bool:
        return index < self._done

    def record(self, stream: Any, index: int | None = None) -> None:
        current = self._stream
        if current is None or stream is not current:
            return  # a stale stream, replaced by a later start or a load
        if index is not None and index != self._done:
            raise ValueError("a mixture's batches are recorded in order: keep in_order=True")
        walked = current.after.pop(self._done, None)
        if walked is None:
            walked, _ = self._mixture.mix_plan.step(self._pos, current.global_rows(self._done))
        self._pos = walked
        self._done += 1
        self._batch_epoch = current.epoch
        self.step += 1

    def frontier(self) -> int:
        """The global step of the next batch (batches are handed out in order)."""
        return self.global_step

    def skip_due(self) -> bool:
        return self.skips.due(self.global_step) is not None

    def issue_limit(self, stream: Any) -> int:
        """Steps of `stream` below the next range to skip (the loader reads no further)."""
        start, current = self.skips.next_start(self.global_step), self._stream
        if current is None or stream is not current or start is None:
            return int(stream.num_batches)
        return max(0, min(current.num_batches, start - (self.global_step - self._done)))

    def apply_skips(self, batching: Batching) -> None:
        """Jump over due steps (through the end of the epoch at most): every dataset moves on
        by the rows those steps hold, unread, and the range is kept in `steps_skipped`."""
        while (stop := self.skips.due(self.global_step)) is not None:
            self.move(self._pos)
            stream = self.peek(batching)
            steps = min(stop - self.global_step, stream.num_batches)
            first, pos = self.global_step, self._pos
            for index in range(steps):
                pos, _ = self._mixture.mix_plan.step(pos, stream.global_rows(index))
            self.steps_skipped.append([first, first + steps])
            self.move(pos)
            if steps == 0:
                return

    def batches(self, batching: Batching) -> int:
        return self._pos.step + self.peek(batching).num_batches

    def set_epoch(self, epoch: int) -> None:
        if epoch not in (self._pos.epoch, self._batch_epoch):
            raise ValueError(
                f"set_epoch({epoch}): a mixture is at epoch {self._pos.epoch}, and its datasets' "
                "passes are not a function of the epoch; resume a mixture by loading its state"
            )
