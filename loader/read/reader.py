"""Reading one batch: task → plan positions → one sorted read → tensors in stream order.

The reader is what DataLoader workers run. It holds only picklable descriptions and opens
the source lazily in whichever process first reads (Lance is not fork-safe, so a handle
opened in the parent is never used in a child). A read can be cut into sub-reads run at
once (in a worker, where torch hands out one task at a time: `batches(task, sub_reads)`),
each retried on transient I/O errors; a read returns every row or raises.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from torch.utils.data import Dataset, default_collate

from loader.cache_plan import time_of
from loader.plan import EpochPlan, PlanSpec
from loader.read.convert import table_to_batch
from loader.read.direct import DirectColumns
from loader.read.prefetch import take_in_parts
from loader.read.retry import ReadPolicy, with_retries
from loader.sources import ResolvedSource, RowSource, open_source
from loader.stream import BatchTask, task_order_indices

OnError = Literal["raise", "skip", "warn"]
ON_ERROR: tuple[str, ...] = ("raise", "skip", "warn")


def cut_columns(whole: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    """Rows [a, b) of every column of a read (views)."""
    return {k: v[a:b] for k, v in whole.items()}


def _pinned_parts(whole: Any) -> Any:
    if isinstance(whole, dict):
        return {k: _pinned_parts(v) for k, v in whole.items()}
    if isinstance(whole, tuple):
        return tuple(_pinned_parts(v) for v in whole)
    return whole.pin_memory() if hasattr(whole, "pin_memory") else whole


class SlicedRead(Sequence[Any]):
    """A read's batches, cut from its whole columns when asked (`cut(whole, a, b)`).

    A worker pickles the read's whole columns, not a tensor per column and batch (with
    `table_to_batch`'s one storage, one file-descriptor round trip a read: see
    benchmarks/handoff.py), and pinning pins each column once. Indexing and iterating give
    the batch dicts, as a list of them would.
    """

    def __init__(self, whole: Any, bounds: list[int], cut: Callable[[Any, int, int], Any]) -> None:
        self.whole, self.bounds, self.cut = whole, bounds, cut

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch {index} of a read of {len(self)}")
        index %= len(self)
        return self.cut(self.whole, self.bounds[index], self.bounds[index + 1])

    def pin_memory(self) -> SlicedRead:
        """The same read with its columns in pinned memory (torch's pin_memory calls it)."""
        return SlicedRead(_pinned_parts(self.whole), self.bounds, self.cut)


class BatchReader(Dataset[Sequence[Any]]):
    """Map-style dataset whose keys are `BatchTask`s and whose items are a read's batches."""

    def __init__(
        self,
        source: ResolvedSource,
        plan: PlanSpec,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        on_error: OnError = "raise",
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error={on_error!r}; expected one of {list(ON_ERROR)}")
        self.source = source
        self.plan = plan
        self.transform = transform
        self.on_error = on_error
        self._opened: RowSource | None = None
        self._pid = -1
        self._epoch_plan: EpochPlan | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._read_policy: ReadPolicy | None = None
        self.skipped_rows = 0  # rows on_error skipped in this process
        self.direct_reads = True  # read rows by loader.read.direct where the source can
        self.node_splits: tuple[int, ...] | None = None  # the node's ranks' (None: all)
        self._uses_key: tuple[Any, ...] | None = None  # what the cache's next uses are of
        self._uses_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_opened"], state["_pid"], state["_epoch_plan"] = None, -1, None
        state["_threads"], state["_uses_key"], state["_uses_lock"] = None, None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._uses_lock = threading.Lock()

    def __len__(self) -> int:  # keys are tasks, not 0..n-1; the sampler knows how many
        raise TypeError("BatchReader is indexed by BatchTask; ask the loader for its length")

    def _rows(self) -> RowSource:
        if self._opened is None or self._pid != os.getpid():
            self._opened = open_source(self.source.spec)
            self._threads = None  # a forked child must not reuse the parent's threads
            self._pid = os.getpid()
        return self._opened

    def _pool(self, size: int) -> ThreadPoolExecutor | None:
        """This process's sub-read threads (none for one sub-read); made once per size."""
        if size < 2:
            return None
        if self._threads is None or self._pool_size != size:
            self._threads, self._pool_size = (
                ThreadPoolExecutor(size, thread_name_prefix="elastic-loader-subread"),
                size,
            )
        return self._threads

    def _take(self, positions: NDArray[np.int64]) -> pa.Table:
        """Every row at `positions`, retrying transient failures; never fewer rows."""
        uri = self.source.spec.uri
        table = with_retries(lambda: self._rows().take(positions), self._policy())
        if table.num_rows != len(positions):
            raise RuntimeError(
                f"a read of {len(positions)} rows from {uri!r} returned {table.num_rows}"
            )
        return table

    def _policy(self) -> ReadPolicy:
        if self._read_policy is None:
            self._read_policy = ReadPolicy.of(self.source.spec)
        return self._read_policy

    def _plan_of(self, epoch: int) -> EpochPlan:
        if self._epoch_plan is None or self._epoch_plan.epoch != epoch:
            self._epoch_plan = self.plan.epoch(epoch)
        return self._epoch_plan

    def positions(self, task: BatchTask) -> NDArray[np.int64]:
        """Table positions of a task's rows, in stream order."""
        order_idx = task_order_indices(task, self.plan.rows_per_split)
        # Ask the plan split by split (ascending order index), so consecutive rows share a
        # clump and its permutation is computed once, then put them back in stream order.
        by_split = np.argsort(order_idx, kind="stable")
        positions = np.empty_like(order_idx)
        positions[by_split] = self._plan_of(task.epoch).order(order_idx[by_split])
        rows = self.source.rows
        return positions if rows is None else rows[positions]

    def read(
        self, positions: NDArray[np.int64], sub_reads: int = 1
    ) -> tuple[pa.Table, NDArray[np.int64]]:
        """One read in ascending position order (in up to `sub_reads` parts at once), and
        the order that restores the request."""
        ascending = np.argsort(positions, kind="stable")
        with_retries(self._rows, self._policy())  # open (or reopen after a fork) first
        table = take_in_parts(self._take, positions[ascending], self._pool(sub_reads), sub_reads)
        restore = np.empty_like(ascending)
        restore[ascending] = np.arange(len(ascending))
        return table, restore

    def _direct(self) -> DirectColumns | None:
        """The source's direct reads (local Lance files), or None: read by `take`."""
        if not self.direct_reads:
            return None
        rows = with_retries(self._rows, self._policy())  # open (or reopen after a fork)
        direct = getattr(rows, "direct", None)
        return direct() if direct is not None else None

    def __getitem__(self, task: BatchTask) -> Sequence[Any]:
        return self.batches(task)

    def task_time(self, task: BatchTask) -> int:
        """The task's time on the node cache's clock: its lowest level (`loader.cache_plan`)."""
        return int(time_of(task.runs[:, 1].min(), self.plan.rows_per_split))

    def use_plan(self, rows: Any, epoch: int) -> Any:
        """The node cache `rows` reads through, told this epoch's next uses of its files
        (once per epoch and process); None without a cache."""
        cache = getattr(rows, "cache", None)
        if cache is None:
            return None
        key = (epoch, self.node_splits, self._pid)
        with self._uses_lock:
            if self._uses_key != key:
                plan, mapping = self._plan_of(epoch), self.source.rows

                def split_positions(split: int) -> NDArray[np.int64]:
                    found = plan.split_rows(split)
                    return found if mapping is None else mapping[found]

                splits = self.node_splits
                if splits is None:
                    splits = tuple(range(self.plan.num_splits))
                cache.uses = rows.file_uses(split_positions, splits, self.plan.rows_per_split)
                self._uses_key = key
        return cache

    def _clock(self, task: BatchTask) -> contextlib.AbstractContextManager[None]:
        """A read through a node cache with a limit: eviction by the plan's next uses."""
        rows = with_retries(self._rows, self._policy())  # open (or reopen after a fork)
        cache = getattr(rows, "cache", None)
        if cache is None or cache.spec.limit is None or not len(task.runs):
            return contextlib.nullcontext()
        self.use_plan(rows, task.epoch)
        return cache.at(self.task_time(task))

    def batches(self, task: BatchTask, sub_reads: int = 1) -> Sequence[Any]:
        """The task's batches, from one read; numeric columns are slices of one tensor each."""
        positions = self.positions(task)
        bounds = np.cumsum((0, *task.sizes)).tolist()
        direct = self._direct() if self.transform is None else None
        if direct is not None:  # one copy straight into stream order, no take
            return SlicedRead(direct.gather(positions), bounds, cut_columns)
        with self._clock(task):
            table, restore = self.read(positions, sub_reads)
        spans = list(itertools.pairwise(bounds))
        if self.transform:
            return [self._rows_through_transform(table, restore[a:b]) for a, b in spans]
        return SlicedRead(table_to_batch(table, restore), bounds, cut_columns)

    def transformed(
        self, rows: list[dict[str, Any]], on_each: Callable[[], None] | None = None
    ) -> Iterator[Any]:
        """Rows through the user's transform (or as they are): the one place `on_error`
        applies, and skipped rows are counted. `on_each` runs before each row is handed on
        (or skipped), so a position can follow the rows."""
        for row in rows:
            if on_each is not None:
                on_each()
            if self.transform is None:
                yield row
                continue
            try:
                out = self.transform(row)
            except Exception as err:
                if self.on_error == "raise":
                    raise
                self.skipped_rows += 1
                if self.on_error == "warn":
                    warnings.warn(f"transform failed on a row, skipped: {err!r}", stacklevel=2)
                continue
            yield out

    def _rows_through_transform(self, table: pa.Table, restore: NDArray[np.int64]) -> Any:
        """The per-row path, only when the user asked for a per-row transform."""
        out = list(self.transformed(table.take(pa.array(restore)).to_pylist()))
        return default_collate(out) if out else {}
