"""When the plan reads each cached file: Belady eviction and the prefetcher (issue #35).

The plan is pure, so every process of a node can tell, with no coordination, when each
fragment of the table is read next. The clock is a row's *level* (its index in its split):
every rank reads its splits smallest-cursor-first, so all splits advance level by level at
the same rate in both layouts, on any W, after any resume. Levels are grouped into at most
`TIME_BUCKETS` buckets; `FileUses` holds, for each fragment, the buckets of the epoch in
which the node reads it (one numpy pass over the node's rows, once per epoch).

Eviction then removes the file whose next use is furthest away (`belady_order`): files
with no further use this epoch first, then the furthest, ties least recently used first.

The prefetcher (`Prefetcher`) runs in the process that knows a rank's task sequence: the
main process of the rank (with DataLoader workers too; they read one task at a time and do
not know what comes next). It fetches the files of the next tasks into the node cache in a
background thread, at most `prefetch_bytes` of them ahead of the batch handed out, and pins
them (a shared lock no eviction takes) until the loader has handed their batches out. It
never reads rows, so it cannot change the order; its errors are dropped (the read that
needs the file fetches it and reports what fails).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

TIME_BUCKETS = 1024  # the clock's resolution: an epoch is cut into at most this many times
NEVER = np.iinfo(np.int64).max  # the next use of a file with none left this epoch
PREFETCH_BYTES = 256 << 20  # the default bytes a rank's prefetcher holds ahead of its reads


def buckets(rows_per_split: int) -> int:
    return max(1, min(rows_per_split, TIME_BUCKETS))


def time_of(levels: NDArray[np.int64], rows_per_split: int) -> NDArray[np.int64]:
    """The clock bucket of each level (a row's index in its split)."""
    return np.asarray(levels, dtype=np.int64) * buckets(rows_per_split) // rows_per_split


def next_uses(used: NDArray[np.bool_], rows: NDArray[np.int64], now: int) -> NDArray[np.int64]:
    """For each row of `used` (fragments × times) in `rows`, the first time >= `now` it is
    used (NEVER when none)."""
    ahead = used[rows, now:]
    if ahead.shape[1] == 0:
        return np.full(len(rows), NEVER, dtype=np.int64)
    first = ahead.argmax(axis=1).astype(np.int64) + now
    return np.where(ahead.any(axis=1), first, NEVER)


def belady_order(next_use: NDArray[np.int64], age: NDArray[np.int64]) -> NDArray[np.int64]:
    """Eviction order of the candidates: furthest next use first (NEVER before all), ties
    by `age` (older, i.e. smaller mtime, first)."""
    return np.lexsort((np.asarray(age), -np.asarray(next_use, dtype=np.int64)))


class FileUses:
    """One epoch's uses of a table's cached files by the node's ranks."""

    def __init__(self, used: NDArray[np.bool_], file_fragment: dict[str, int]) -> None:
        self.used = used
        self.file_fragment = file_fragment

    @classmethod
    def build(
        cls,
        split_positions: Callable[[int], NDArray[np.int64]],
        splits: Iterable[int],
        starts: NDArray[np.int64],
        fragment_files: list[list[str]],
        rows_per_split: int,
    ) -> FileUses:
        """`split_positions(s)`: table positions of split s in order (level 0, 1, ...);
        `starts`: first position of each fragment and one past the last."""
        times = buckets(rows_per_split)
        used = np.zeros((len(fragment_files), times), dtype=np.bool_)
        clock = time_of(np.arange(rows_per_split, dtype=np.int64), rows_per_split)
        for split in splits:
            fragment = np.searchsorted(starts, split_positions(split), side="right") - 1
            used[fragment, clock] = True
        where = {rel: i for i, files in enumerate(fragment_files) for rel in files}
        return cls(used, where)

    def next_use(self, files: list[str], now: int) -> NDArray[np.int64]:
        """Each file's next use at or after time `now` (NEVER: none left, or not this table's)."""
        out = np.full(len(files), NEVER, dtype=np.int64)
        known = [i for i, rel in enumerate(files) if rel in self.file_fragment]
        if known:
            rows = np.array([self.file_fragment[files[i]] for i in known], dtype=np.int64)
            out[known] = next_uses(self.used, rows, now)
        return out


class Prefetcher:
    """Fetches the files of a rank's next tasks ahead of its reads, in one daemon thread.

    `plan` yields (last batch index of a task, its files, its clock time) in stream order;
    `fetch(rel, time, size)` makes one file whole in the node cache: the bytes it fetched,
    None when it was whole, -1 when there is no room yet; `pin(rel)` returns a context that keeps a file from eviction. `reached(index)`
    tells it the batch handed out; `stop()` ends it (also when the loader's iterator is
    dropped). At most `limit` bytes are pinned ahead (a file alone may exceed it)."""

    def __init__(
        self,
        plan: Iterator[tuple[int, list[str], int]],
        fetch: Callable[[str, int, int], int | None],
        pin: Callable[[str], contextlib.AbstractContextManager[Any]],
        size_of: Callable[[str], int],
        limit: int,
    ) -> None:
        self._plan, self._fetch, self._pin, self._size_of = plan, fetch, pin, size_of
        self.limit = limit
        self.prefetched = 0  # files this prefetcher fetched (counted by the cache too)
        self._reached = -1  # the latest batch index handed out
        self._ahead = -1  # the last batch index whose files are all whole
        self._held: dict[str, tuple[int, contextlib.ExitStack, int]] = {}  # rel: last, pin, size
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name="elastic-loader-prefetch", daemon=True
        )
        self._thread.start()

    @property
    def lead(self) -> int | None:
        """Batches ahead of the one handed out whose files are all in the cache (None once
        stopped)."""
        with self._changed:
            return None if self._stopped else max(0, self._ahead - self._reached)

    def reached(self, index: int) -> None:
        """The batch `index` was handed out: files no later batch in the window needs unpin."""
        with self._changed:
            self._reached = max(self._reached, index)  # in_order=False: any order
            for rel in [r for r, (last, _, _) in self._held.items() if last <= index]:
                self._held.pop(rel)[1].close()
            self._changed.notify_all()

    def stop(self) -> None:
        """Unpin everything and let the thread end: it pins nothing more, and a download
        under way finishes on its own (the caller never waits for it)."""
        with self._changed:
            self._stopped = True
            for _, stack, _ in self._held.values():
                stack.close()
            self._held.clear()
            self._changed.notify_all()

    def _pinned_bytes(self) -> int:
        return sum(size for _, _, size in self._held.values())

    def _run(self) -> None:
        try:
            for last, files, time in self._plan:
                for rel in files:
                    if not self._take(rel, last, time):
                        return
                with self._changed:
                    self._ahead = max(self._ahead, last)
        except Exception:  # a read that needs the file reports the failure
            return

    def _take(self, rel: str, last: int, time: int) -> bool:
        """Pin and fetch one file for the task ending at batch `last`; False once stopped.
        A file with no room yet (every cached file is needed sooner) waits for a read."""
        while True:
            with self._changed:
                if rel in self._held:
                    held_last, stack, size = self._held[rel]
                    self._held[rel] = (max(last, held_last), stack, size)
                    return not self._stopped
                size = self._size_of(rel)
                while not self._stopped and self._held and self._pinned_bytes() + size > self.limit:
                    self._changed.wait()
                if self._stopped:
                    return False
                if last <= self._reached:  # handed out meanwhile: nothing to fetch ahead
                    return True
                stack = contextlib.ExitStack()
                stack.enter_context(self._pin(rel))
                self._held[rel] = (last, stack, size)
                reached = self._reached
            fetched = self._fetch(rel, time, size)
            with self._changed:
                if fetched is not None and fetched > 0:
                    self.prefetched += 1
                if fetched is None or fetched >= 0:
                    return True
                if rel in self._held:  # (stop() may have unpinned it meanwhile)
                    self._held.pop(rel)[1].close()  # no room: wait for the next batch out
                while not self._stopped and self._reached == reached:
                    self._changed.wait()
