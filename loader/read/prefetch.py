"""Reads in flight: enough concurrent reads to hide a store's latency, in bounded memory.

Lance releases the GIL while it reads, so threads overlap reads with each other and with
the training step. On an object store every request costs a round trip; one read at a
time leaves the link idle most of the time, so many are kept in flight. Results always
come back in request order, whatever finishes first, so the batches and the state never
depend on how many reads run at once.

Two places use it: with `num_workers=0` the main process reads the next tasks ahead
(`map_ahead`); in a DataLoader worker, which gets one task at a time from torch, each task
is cut into sub-reads run together (`take_in_parts`). Either way at most `reads_in_flight`
reads are held by a process beyond the one being handed out.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loader.sources import SourceSpec, is_remote

T = TypeVar("T")
R = TypeVar("R")

OBJECT_STORE_READS = 16  # what lance.torch keeps in flight; hides ~50 ms round trips
LOCAL_READS = 4  # page cache or local disk: more only adds threads on a small machine
MIN_ROWS_PER_PART = 1024  # a sub-read smaller than this costs more than it hides


def auto_reads_in_flight(spec: SourceSpec, num_workers: int) -> int:
    """The default: many reads for an object store, a few locally; a worker gets its share."""
    if is_remote(spec):
        return max(2, OBJECT_STORE_READS // max(1, num_workers))
    return LOCAL_READS if num_workers == 0 else 1


def map_ahead(fn: Callable[[T], R], items: Iterable[T], depth: int) -> Iterator[R]:
    """`map(fn, items)` with up to `depth` calls running ahead in threads, in order."""
    if depth < 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="elastic-loader-read")
    pending: deque[Future[R]] = deque()
    source = iter(items)
    settled = False  # a failed read: the reads still running end before the error is raised
    try:
        for item in source:
            pending.append(pool.submit(fn, item))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except Exception:
        pool.shutdown(wait=True, cancel_futures=True)
        settled = True
        raise
    finally:  # the consumer stopped early: running reads finish in the background
        if not settled:
            pool.shutdown(wait=False, cancel_futures=True)


def parts_of(count: int, reads_in_flight: int) -> list[tuple[int, int]]:
    """[start, stop) bounds cutting `count` rows into at most `reads_in_flight` sub-reads."""
    parts = max(1, min(reads_in_flight, count // MIN_ROWS_PER_PART))
    bounds = np.linspace(0, count, parts + 1).astype(np.int64).tolist()
    return list(itertools.pairwise(bounds))


def take_in_parts(
    take: Callable[[NDArray[np.int64]], pa.Table],
    positions: NDArray[np.int64],
    pool: ThreadPoolExecutor | None,
    reads_in_flight: int,
) -> pa.Table:
    """`take(positions)` as up to `reads_in_flight` sub-reads at once, concatenated in order."""
    bounds = parts_of(len(positions), reads_in_flight) if pool is not None else []
    if pool is None or len(bounds) == 1:  # no part bounds computed without a pool
        return take(positions)
    futures = [pool.submit(take, positions[a:b]) for a, b in bounds]
    wait(futures)  # a failed part raises only once no other part is running behind it
    return pa.concat_tables([f.result() for f in futures])
