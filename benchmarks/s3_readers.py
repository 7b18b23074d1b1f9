"""Readers on the object store (issue #12): ours, and raw Lance takes of exactly its reads.

Both read the table that ``targets12.py`` wrote on the local S3 server, through its
fault-injecting proxy (the URI and options come in ``BENCH_S3_DB`` / ``BENCH_S3_OPTIONS``),
with the same reads in flight (``case.reads_in_flight``, default the loader's 16):
``raw_take_s3`` runs Lance ``take`` of the same sorted positions, read for read, through
the same ``map_ahead``, and stops there (no tensors). So ours ÷ raw is what the loader
adds on top of the store's own cost. Both are timed from building the reader to the last
row (the first read included), over the whole ``max_rows``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from common import COLUMNS, TABLE, Case, Result

ENV_DB, ENV_OPTIONS = "BENCH_S3_DB", "BENCH_S3_OPTIONS"
DEFAULT_IN_FLIGHT = 16


def drain_from_start(
    make: Callable[[], Iterable], count: Callable[[Any], int], case: Case
) -> Result:
    """Rows/s from building the reader to its ``case.max_rows``-th row, first read included.

    ``common.drain`` times the steady state after the first batch; with 16 reads of 8,192
    rows in flight that would time rows already read while the clock was stopped.
    """
    started = time.perf_counter()
    rows, first = 0, None
    for item in make():
        rows += count(item)
        first = first or time.perf_counter() - started
        if rows >= case.max_rows or time.perf_counter() - started > case.max_seconds:
            break
    return Result(
        rows=rows,
        seconds=time.perf_counter() - started,
        first_batch_s=first or 0.0,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        worker_peak_rss_mib=0.0,
        first_batch_at=time.time(),
    )


def _store() -> tuple[str, dict[str, str]]:
    return os.environ[ENV_DB], json.loads(os.environ[ENV_OPTIONS])


def _in_flight(case: Case) -> int:
    return DEFAULT_IN_FLIGHT if case.reads_in_flight is None else case.reads_in_flight


def _dataset(case: Case) -> Any:
    import lancedb

    from loader import StreamingDataset

    db, options = _store()
    return StreamingDataset(
        lancedb.connect(db, storage_options=options).open_table(TABLE),
        columns=list(COLUMNS),
        num_splits=case.num_splits,
        shuffle_seed=0,
        shuffle_clump_size=case.clump,
        rank=case.rank,
        world_size=case.world_size,
    )


def ours_s3(case: Case) -> Result:
    """StreamingDataLoader on the S3 table, ``reads_in_flight`` reads at once (w = 0)."""
    from loader import StreamingDataLoader

    def make() -> Any:
        return StreamingDataLoader(
            _dataset(case), batch_size=case.batch_size, reads_in_flight=_in_flight(case)
        )

    return drain_from_start(make, lambda batch: len(batch["id"]), case)


def raw_take_s3(case: Case) -> Result:
    """Lance ``take`` of ours' reads (its tasks' sorted positions), as many in flight."""
    import lance

    from loader import StreamingDataLoader
    from loader.progress import Batching
    from loader.read.prefetch import map_ahead

    ds = _dataset(case)
    per_read = StreamingDataLoader(ds, batch_size=case.batch_size).batches_per_read
    stream = ds.progress.peek(Batching(case.batch_size, False))
    reads = [np.sort(ds.reader.positions(task)) for task in stream.tasks(per_read)]
    uri = ds.source.spec.uri
    _, options = _store()

    def make() -> Any:
        table = lance.dataset(uri, storage_options=options)
        take = lambda p: table.take(p, columns=list(COLUMNS))  # noqa: E731
        return map_ahead(take, reads, _in_flight(case))

    return drain_from_start(make, lambda read: read.num_rows, case)
