"""The loader's side of the node cache's prefetch (issue #35): a rank's next tasks' files.

The main process of a rank knows its whole task sequence (the stream is pure), with or
without DataLoader workers, so the prefetcher runs there: one per rank, whatever the number
of workers, and its window is counted once. It opens the table's manifest (no rows) and
fetches whole files into the node cache; the reads, in this process or in workers, then
find them there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from loader.cache_plan import PREFETCH_BYTES, Prefetcher
from loader.read.reader import BatchReader
from loader.read.retry import with_retries
from loader.stream import RankStream


def prefetch_bytes(value: int | str | None) -> int:
    """`cache_prefetch_bytes=`: bytes (or '512MB'); 0 turns prefetch off; None: the default."""
    from loader.cache import parse_limit

    if value is None:
        return PREFETCH_BYTES
    if value == 0:
        return 0
    try:
        parsed = parse_limit(value)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValueError(
            f"cache_prefetch_bytes={value!r}: expected bytes >= 0 as an int or a size such "
            f"as '512MB' (0 turns prefetch off)"
        )
    return parsed


def node_splits(stream: Any) -> tuple[int, ...] | None:
    """The splits the ranks of this node read (torchrun's LOCAL_WORLD_SIZE consecutive
    ranks a node); None (all splits) when the node's ranks are not known."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if not isinstance(stream, RankStream) or not local or not local.isdigit() or int(local) < 1:
        return None
    size = int(local)
    first = stream.rank // size * size
    found: set[int] = set()
    for rank in range(first, min(first + size, stream.world_size)):
        found.update(dataclasses.replace(stream, rank=rank).splits)  # type: ignore[type-var]
    return tuple(sorted(found))


def start_prefetch(dataset: Any, stream: Any, per_read: int, window: int) -> Any:
    """A prefetcher of `stream`'s tasks' files (None: no node cache, prefetch off, or a
    reader it does not apply to: packed blocks and mixtures read on demand)."""
    reader = getattr(dataset, "reader", None)
    if type(reader) is not BatchReader or not isinstance(stream, RankStream):
        return None
    reader.node_splits = node_splits(stream)  # before workers copy the reader
    if window <= 0 or getattr(dataset, "cache_spec", None) is None:
        return None
    try:
        rows: Any = with_retries(reader._rows, reader._policy())
    except Exception:  # the reads open it again and report why they cannot
        return None
    cache = reader.use_plan(rows, stream.epoch)
    if cache is None:
        return None
    if cache.spec.limit is not None:
        window = min(window, cache.spec.limit // 2)  # the reads keep the other half

    def plan() -> Iterator[tuple[int, list[str], int]]:
        for task in stream.tasks(per_read):
            files = rows.files_of(np.sort(reader.positions(task)))
            yield task.index + len(task.sizes) - 1, files, reader.task_time(task)

    return Following(
        Prefetcher(plan(), cache.prefetch, cache.pinned, rows.file_size, window), cache
    )


class Following:
    """Tells the prefetcher each batch handed out and reports its lead in the node stats."""

    def __init__(self, prefetcher: Prefetcher, cache: Any) -> None:
        self.prefetcher, self.cache = prefetcher, cache

    def follow(self, pairs: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        """`pairs` (index, batch) as they are; the prefetcher stops when they end or the
        iterator is dropped."""
        try:
            for index, batch in pairs:
                self.prefetcher.reached(index)
                self.cache.counts.prefetch_lead = self.prefetcher.lead
                self.cache.write_stats()
                yield index, batch
        finally:
            self.prefetcher.stop()
            self.cache.counts.prefetch_lead = None
            self.cache.write_stats(force=True)
