"""Read ahead in threads when there are no worker processes.

Lance and the plan kernels release the GIL, so with `num_workers=0` a couple of threads
reading the next batches overlap I/O with the training step (and with each other) at no
cost in order: results come back in task order, whatever finishes first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def map_ahead(fn: Callable[[T], R], items: Iterable[T], depth: int) -> Iterator[R]:
    """`map(fn, items)` with up to `depth` calls running ahead in threads, in order."""
    if depth < 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="elastic-loader-read")
    pending: deque[Future[R]] = deque()
    source = iter(items)
    try:
        for item in source:
            pending.append(pool.submit(fn, item))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
