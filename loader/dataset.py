"""StreamingDataset: one rank's rows of a pinned table, in the elastic order.

Keeps the keyword names of `lancedb.streaming.StreamingDataset`, so switching is one
import. It owns the plan, the pinned source and the position (epoch and per-split
cursors); `StreamingDataLoader` batches it. Iterating the dataset directly yields rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from torch.utils.data import IterableDataset, get_worker_info

from loader import state as st
from loader.layout import check_world_size, owned_splits
from loader.plan import PlanSpec
from loader.reader import BatchReader, OnError
from loader.sources import ResolvedSource, identity_for, resolve_source
from loader.stream import RankStream
from loader.world import World, agree_with_rank0, resolve_world

ROW_READ_SIZE = 1024  # rows per read when iterating the dataset row by row


class StreamingDataset(IterableDataset[dict[str, Any]]):
    """This rank's rows; see the README for the order, the state and elastic resume."""

    def __init__(
        self,
        source: Any,
        columns: list[str] | None = None,
        filter: Any = None,
        num_splits: int | None = None,
        shuffle: bool = True,
        shuffle_seed: int = 0,
        shuffle_clump_size: int | None = None,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        on_error: OnError = "raise",
        version: int | None = None,
        allow_source_change: bool = False,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.world: World = resolve_world(rank, world_size)
        if num_splits is None:
            num_splits = self.world.world_size
            warnings.warn(
                f"num_splits not set: using world_size={num_splits}. A resume on another number "
                f"of GPUs needs the same num_splits; set it explicitly (e.g. num_splits=48)",
                stacklevel=2,
            )
        check_world_size(num_splits, self.world.world_size)
        self._source_args = {
            "columns": columns,
            "filter": filter,
            "storage_options": storage_options,
        }
        self._raw_source = source
        self.allow_source_change = allow_source_change
        self.transform, self.on_error = transform, on_error
        self._shuffle = (bool(shuffle), int(shuffle_seed), int(shuffle_clump_size or 1))
        self._num_splits = num_splits
        resolved, plan = self._resolve(version)
        if version is None:  # a fresh start: every rank reads the version rank 0 sees
            agreed = agree_with_rank0(resolved.spec.version)
            if agreed != resolved.spec.version:
                resolved, plan = self._resolve(agreed)
        self._adopt(resolved, plan)
        self._epoch = int(epoch)
        self._cursors: tuple[int, ...] = (0,) * num_splits
        self._progress: tuple[RankStream, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Copies (plain DataLoader workers under spawn) read through the picklable reader;
        the user's table handle stays with the original, which alone may re-pin."""
        state = self.__dict__.copy()
        state["_raw_source"] = None
        return state

    # -- the source and the plan ------------------------------------------------------

    def _resolve(self, version: int | None) -> tuple[ResolvedSource, PlanSpec]:
        """The source at `version` and the plan on its filtered row count (changes nothing)."""
        if self._raw_source is None:
            raise RuntimeError(
                "this StreamingDataset is a pickled copy (e.g. inside a DataLoader worker) and "
                "cannot reopen its source; load states into the original in the main process"
            )
        resolved = resolve_source(self._raw_source, version=version, **self._source_args)
        shuffle, seed, clump = self._shuffle
        return resolved, PlanSpec(resolved.num_rows, self._num_splits, shuffle, seed, clump)

    def _adopt(self, resolved: ResolvedSource, plan: PlanSpec) -> None:
        self.plan = plan
        self.reader = BatchReader(resolved, plan, self.transform, self.on_error)

    @property
    def source(self) -> ResolvedSource:
        return self.reader.source

    @property
    def num_rows(self) -> int:
        return self.plan.num_rows

    @property
    def num_splits(self) -> int:
        return self.plan.num_splits

    @property
    def rows_per_split(self) -> int:
        return self.plan.rows_per_split

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size

    @property
    def splits(self) -> range:
        """The splits this rank owns."""
        return owned_splits(self.rank, self.world_size, self.num_splits)

    @property
    def epoch(self) -> int:
        return self._epoch

    def plan_identity(self, drop_last: bool) -> dict[str, Any]:
        return self._identity(self.plan, self.source, drop_last)

    def _identity(self, plan: PlanSpec, source: ResolvedSource, drop_last: bool) -> dict[str, Any]:
        shuffle, seed, clump = self._shuffle
        return {
            "num_rows": plan.num_rows,
            "num_splits": plan.num_splits,
            "rows_per_split": plan.rows_per_split,
            "shuffle": shuffle,
            "shuffle_seed": seed,
            "shuffle_clump_size": clump,
            "filter": source.filter
            if isinstance(source.filter, str | None)
            else str(source.filter),
            "drop_last": drop_last,
        }

    # -- position -----------------------------------------------------------------------

    def position(self) -> tuple[int, tuple[int, ...]]:
        """(epoch, cursors) after the rows handed out so far; a finished epoch is the next one."""
        if self._progress is None:
            return self._epoch, self._cursors
        stream, done = self._progress
        if done >= stream.rows:
            return stream.epoch + 1, (0,) * self.num_splits
        return stream.epoch, tuple(stream.cursors_at(done))

    def _settle(self) -> None:
        self._epoch, self._cursors = self.position()
        self._progress = None

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the position is already in it."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._settle()
        if epoch != self._epoch:
            self._epoch, self._cursors = epoch, (0,) * self.num_splits

    def start_stream(self, batch_size: int, drop_last: bool) -> RankStream:
        """This rank's rest of the epoch from the current position; progress is then tracked."""
        self._settle()
        stream = self.peek_stream(batch_size, drop_last)
        self._progress = (stream, 0)
        return stream

    def peek_stream(self, batch_size: int, drop_last: bool) -> RankStream:
        """The stream an iteration would start now, without starting it."""
        epoch, cursors = self.position()
        return RankStream(
            epoch, cursors, self.rows_per_split, self.rank, self.world_size, batch_size, drop_last
        )

    def record(self, stream: RankStream, rows_done: int) -> None:
        """Note that `rows_done` rows of `stream` reached the training loop."""
        self._progress = (stream, rows_done)

    def state_dict(self) -> dict[str, Any]:
        """The row-level position (the loader's `state_dict` is the one to use with batches)."""
        return self.make_state(1, False, 0)

    def make_state(self, batch_size: int, drop_last: bool, step: int) -> dict[str, Any]:
        """The state at the current position; `skipped` is what batches of this size leave out."""
        epoch, cursors = self.position()
        skipped = self.peek_stream(batch_size, drop_last).skipped
        return st.make_state(
            self.plan_identity(drop_last),
            self.source.spec.identity(),
            epoch,
            list(cursors),
            skipped,
            self.world_size,
            step,
        )

    def load_state_dict(self, state: dict[str, Any], drop_last: bool | None = None) -> None:
        """Validate `state` against this dataset and move to it (effective at the next iteration).

        A LanceDB/Lance source is reopened at the state's version first, so the plan is
        rebuilt on exactly the rows the saved run was reading.
        """
        st.check_state(state)
        resolved, plan = self.source, self.plan
        saved_version = state[st.KEY_SOURCE].get("version")
        if saved_version is not None and saved_version != resolved.spec.version:
            resolved, plan = self._resolve(saved_version)
        saved_source = state[st.KEY_SOURCE]
        st.check_source(state, identity_for(resolved.spec, saved_source), self.allow_source_change)
        fields = ["num_splits", "shuffle", "shuffle_seed", "shuffle_clump_size", "filter"]
        if not self.allow_source_change:
            fields.append("num_rows")
        if drop_last is not None:
            fields.append("drop_last")
        st.check_plan(state, self._identity(plan, resolved, bool(drop_last)), tuple(fields))
        cursors = st.check_cursors(state, plan.num_splits, plan.rows_per_split)
        check_world_size(plan.num_splits, self.world_size)
        if resolved is not self.source:  # every check passed: only now re-pin
            self._adopt(resolved, plan)
        epoch = state[st.KEY_EPOCH]
        if all(c == self.rows_per_split for c in cursors):
            epoch, cursors = epoch + 1, [0] * self.num_splits
        self._epoch, self._cursors, self._progress = epoch, tuple(cursors), None

    # -- rows ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.peek_stream(1, False).rows

    def __iter__(self) -> Iterator[Any]:
        """This rank's remaining rows of the epoch; the position follows the rows yielded.

        Inside DataLoader workers each worker takes every w-th read of the stream, so the
        union is every row once (use StreamingDataLoader for an order independent of w).
        """
        info = get_worker_info()
        stream = (
            self.start_stream(ROW_READ_SIZE, False)
            if info is None
            else self.peek_stream(ROW_READ_SIZE, False)
        )
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(worker, stream.num_batches, workers):
            table, restore = self.reader.read(self.reader.positions(stream.task(index)))  # one read
            rows = table.take(pa.array(restore)).to_pylist()
            for offset, row in enumerate(rows):
                if info is None:
                    self.record(stream, index * ROW_READ_SIZE + offset + 1)
                if self.transform is None:
                    yield row
                    continue
                try:
                    yield self.transform(row)
                except Exception as err:
                    if self.on_error == "raise":
                        raise
                    if self.on_error == "warn":
                        warnings.warn(f"transform failed on a row, skipped: {err!r}", stacklevel=2)

    def __repr__(self) -> str:
        spec = self.source.spec
        return (
            f"StreamingDataset({spec.kind}:{spec.uri} v{spec.version}, N={self.num_rows}, "
            f"S={self.num_splits}, rank {self.rank}/{self.world_size}, epoch {self._epoch})"
        )
