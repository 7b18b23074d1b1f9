"""Every loader the benchmark measures, one function each, registered by name in READERS.

All share one signature, ``reader(case: Case) -> Result``: import the loader, hand
``common.drain`` a function that builds it for ``case`` (clump, batch size, workers, rank
of world size), and return what drain measured. Imports are inside each function so a
measuring process loads only its own loader (and its peak memory is its own).

Raw readers are the ceiling. ``raw_take`` is Lance ``take`` of exactly the rows of each
batch ours yields (the target's "same positions"); ``raw_random`` the same with C = 1.
``raw_take_clumps`` and ``raw_range`` read one whole clump per batch (issue #5's raw
figures): what a read of these rows costs when a batch is one contiguous run. Peers run as
their documentation shows, on the same rows, with the same clump and batch size where they
have the knob.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from common import (
    COLUMNS,
    LANCEDB_URI,
    LITDATA_DIR,
    MDS_DIR,
    TABLE,
    Case,
    Result,
    clump_positions,
    drain,
    lance_path,
    rank_slice,
)
from s3_readers import ours_s3, raw_take_s3

SEED = 0
SPAWN = "forkserver"  # lancedb.streaming segfaults in forked workers (environment notes)


def _arrow_rows(batch: Any) -> int:
    return batch.num_rows


def _dict_rows(batch: Any) -> int:
    return len(batch["id"])


def _torch_kwargs(case: Case, context: str | None = None) -> dict[str, Any]:
    kw: dict[str, Any] = {"batch_size": case.batch_size, "num_workers": case.num_workers}
    if case.num_workers and context:
        kw["multiprocessing_context"] = context
    return kw


# -- ours -------------------------------------------------------------------------------


def _ours_kwargs(case: Case) -> dict[str, Any]:
    """The torch arguments, and ours' reads in flight when the case sets them."""
    kw = _torch_kwargs(case)
    if case.reads_in_flight is not None:
        kw["reads_in_flight"] = case.reads_in_flight
    return kw


def _ours_dataset(case: Case) -> Any:
    """Our StreamingDataset on the LanceDB table, S = ``case.num_splits``."""
    import lancedb

    from loader import StreamingDataset

    return StreamingDataset(
        lancedb.connect(str(LANCEDB_URI)).open_table(TABLE),
        columns=list(COLUMNS),
        num_splits=case.num_splits,
        shuffle_seed=SEED,
        shuffle_clump_size=case.clump,
        rank=case.rank,
        world_size=case.world_size,
    )


def ours(case: Case) -> Result:
    """elastic-loader: StreamingDataset + StreamingDataLoader (torch's default context)."""
    import lancedb  # noqa: F401  (imported here so its cost is not timed)

    from loader import StreamingDataLoader

    def make() -> Any:
        return StreamingDataLoader(_ours_dataset(case), **_ours_kwargs(case))

    return drain(make, _dict_rows, case)


def ours_random(case: Case) -> Result:
    """``ours`` with C = 1 (row-level shuffle), to set beside ``raw_random``."""
    return ours(dataclasses.replace(case, clump=1))


def ours_s2(case: Case) -> Result:
    """``ours`` with S = 2: each batch is 2 runs of rows instead of 48 (the cost of S)."""
    return ours(dataclasses.replace(case, num_splits=2))


def ours_resume(case: Case) -> Result:
    """Time to first batch after ``load_state_dict`` at ``resume_at`` of the epoch.

    In one warm process (JIT cache and page cache loaded): a fresh loader's first batch,
    then the same loader read on to ``resume_at`` of the epoch and checkpointed, then a new
    dataset and loader that load the state and are timed to their first batch by ``drain``.
    ``extra`` carries the fresh start's figure beside it.
    """
    import lancedb  # noqa: F401  (imported here so its cost is not timed)

    from loader import StreamingDataLoader

    kw = _ours_kwargs(case)
    next(iter(StreamingDataLoader(_ours_dataset(case), **kw)))  # warm-up, not timed
    t0 = time.perf_counter()
    dl = StreamingDataLoader(_ours_dataset(case), **kw)
    batches = len(dl)
    it = iter(dl)
    next(it)
    fresh = time.perf_counter() - t0
    target = int(case.resume_at * batches)
    for _ in range(target - 1):
        next(it)
    state = dl.state_dict()
    del it

    def make() -> Any:
        resumed = StreamingDataLoader(_ours_dataset(case), **kw)
        resumed.load_state_dict(state)
        return resumed

    result = drain(make, _dict_rows, case)
    result.extra = {"fresh_first_batch_s": fresh, "resumed_at_batch": target, "batches": batches}
    return result


def batch_positions(case: Case) -> list[np.ndarray]:
    """The rows of each batch ours yields on this rank, sorted within the batch.

    Raw reads take exactly these, so ``ours / raw_take`` compares the same rows in the same
    batches; sorting is what any raw read would do (ours sorts too, then restores order).
    """
    from loader.progress import Batching

    ds = _ours_dataset(case)
    stream = ds.progress.peek(Batching(case.batch_size, False))
    count = min(stream.num_batches, -(-case.max_rows // case.batch_size) + 1)
    return [np.sort(ds.reader.positions(stream.task(t))) for t in range(count)]


# -- raw Lance --------------------------------------------------------------------------


def raw_take(case: Case) -> Result:
    """Lance ``take`` of exactly the rows of each batch ours yields (same plan, S, C)."""
    import lance

    batches = batch_positions(case)

    def make() -> Any:
        ds = lance.dataset(lance_path())
        return (ds.take(p, columns=list(COLUMNS)) for p in batches)

    return drain(make, _arrow_rows, case)


def raw_take_reads(case: Case) -> Result:
    """Lance ``take`` of exactly the reads ours makes: its batches grouped as its loader groups
    them (``batches_per_read`` consecutive batches, sorted), no conversion to tensors."""
    import lance

    from loader import StreamingDataLoader

    batches = batch_positions(case)
    per_read = StreamingDataLoader(_ours_dataset(case), batch_size=case.batch_size)
    m = per_read.batches_per_read
    reads = [np.sort(np.concatenate(batches[i : i + m])) for i in range(0, len(batches), m)]

    def make() -> Any:
        ds = lance.dataset(lance_path())
        return (ds.take(p, columns=list(COLUMNS)) for p in reads)

    return drain(make, _arrow_rows, case)


def raw_take_s2(case: Case) -> Result:
    """``raw_take`` of the batches ``ours_s2`` yields."""
    return raw_take(dataclasses.replace(case, num_splits=2))


def raw_take_threads(case: Case) -> Result:
    """``raw_take`` with two reads in flight (threads), as ours reads ahead with w = 0."""
    from concurrent.futures import ThreadPoolExecutor

    import lance

    batches = batch_positions(case)

    def make() -> Any:
        ds = lance.dataset(lance_path())
        pool = ThreadPoolExecutor(2)
        return pool.map(lambda p: ds.take(p, columns=list(COLUMNS)), batches)

    return drain(make, _arrow_rows, case)


def raw_random(case: Case) -> Result:
    """``raw_take`` with C = 1: every row on its own (bounded by the vector column)."""
    return raw_take(dataclasses.replace(case, clump=1))


def _clump_starts(case: Case, n: int) -> np.ndarray:
    order = rank_slice(clump_positions(n, case.clump, SEED), case.rank, case.world_size)
    return order[:: case.clump]  # each clump is contiguous in a clump-shuffled order


def raw_take_clumps(case: Case) -> Result:
    """Lance ``take`` of one whole clump per batch, clumps in shuffled order."""
    import lance

    def make() -> Any:
        ds = lance.dataset(lance_path())
        n = ds.count_rows()
        runs = (np.arange(s, min(s + case.clump, n)) for s in _clump_starts(case, n))
        return (ds.take(p, columns=list(COLUMNS)) for p in runs)

    return drain(make, _arrow_rows, case)


def raw_range(case: Case) -> Result:
    """Range scans of the same clumps: one ``to_table(offset, limit)`` per clump."""
    import lance

    def make() -> Any:
        ds = lance.dataset(lance_path())
        starts = _clump_starts(case, ds.count_rows())
        cols = list(COLUMNS)
        return (ds.to_table(columns=cols, offset=int(s), limit=case.clump) for s in starts)

    return drain(make, _arrow_rows, case)


# -- peers ------------------------------------------------------------------------------


def _lancedb_streaming(case: Case, tuned: dict[str, int]) -> Result:
    import lancedb
    from lancedb.streaming import StreamingDataLoader, StreamingDataset

    def make() -> Any:
        ds = StreamingDataset(
            lancedb.connect(str(LANCEDB_URI)).open_table(TABLE),
            num_splits=case.world_size * max(1, case.num_workers),  # its minimum
            shuffle_seed=SEED,
            rank=case.rank,
            world_size=case.world_size,
            columns=list(COLUMNS),
            **tuned,
        )
        return StreamingDataLoader(ds, **_torch_kwargs(case, SPAWN))

    return drain(make, _dict_rows, case)


def lancedb_streaming(case: Case) -> Result:
    """lancedb.streaming with the same clump and read_batch_size 1024 (its best here)."""
    return _lancedb_streaming(case, {"shuffle_clump_size": case.clump, "read_batch_size": 1024})


def lancedb_streaming_default(case: Case) -> Result:
    """lancedb.streaming with its defaults (row-level shuffle, read_batch_size 64)."""
    return _lancedb_streaming(case, {})


def litdata(case: Case) -> Result:
    """LitData StreamingDataset (shuffle=True) + StreamingDataLoader over ``optimize`` output."""
    from litdata import StreamingDataLoader, StreamingDataset

    def make() -> Any:
        ds = StreamingDataset(str(LITDATA_DIR), shuffle=True, seed=SEED)
        return StreamingDataLoader(ds, **_torch_kwargs(case))

    return drain(make, _dict_rows, case)


def _mosaic_clean(case: Case) -> None:
    """Remove shared memory that a previous mosaic process left behind."""
    from streaming.base.util import clean_stale_shared_memory

    if case.world_size == 1:  # with ranks, mosaic's local leader does its own bookkeeping
        clean_stale_shared_memory()


def mosaic(case: Case) -> Result:
    """mosaicml-streaming StreamingDataset (default py1e shuffle) over MDS shards."""
    from streaming import StreamingDataLoader, StreamingDataset

    _mosaic_clean(case)

    def make() -> Any:
        ds = StreamingDataset(
            local=str(MDS_DIR), shuffle=True, shuffle_seed=SEED, batch_size=case.batch_size
        )
        return StreamingDataLoader(ds, **_torch_kwargs(case))

    return drain(make, _dict_rows, case)


def mosaic_resume(case: Case) -> Result:
    """Mosaic's time to first batch after ``load_state_dict`` at ``resume_at`` of the epoch.

    Its state is five scalars, so the checkpoint at 90 % is made with its own
    ``state_dict(num_samples, from_beginning=True)``; on ``__iter__`` it regenerates the
    whole epoch's shuffle and skips the consumed samples.
    """
    from streaming import StreamingDataLoader, StreamingDataset

    _mosaic_clean(case)
    ds = StreamingDataset(
        local=str(MDS_DIR), shuffle=True, shuffle_seed=SEED, batch_size=case.batch_size
    )
    kw = _torch_kwargs(case)
    next(iter(StreamingDataLoader(ds, **kw)))  # warm-up (page cache, shared memory)
    t0 = time.perf_counter()
    next(iter(StreamingDataLoader(ds, **kw)))
    fresh = time.perf_counter() - t0
    state = ds.state_dict(int(case.resume_at * ds.num_samples), from_beginning=True)

    def make() -> Any:
        ds.load_state_dict(state)
        return StreamingDataLoader(ds, **kw)

    result = drain(make, _dict_rows, case)
    result.extra = {"fresh_first_batch_s": fresh}
    return result


class LanceTorchShard(torch.utils.data.IterableDataset):
    """lance.torch ``LanceDataset`` + ``ShardedBatchSampler`` for one worker of one rank.

    LanceDataset with a sampler ignores DataLoader workers (each would read the whole
    shard), so the dataset is built in ``__iter__`` with the worker's global shard index.
    """

    def __init__(self, case: Case) -> None:
        self.case = case

    def __iter__(self) -> Any:
        from lance.sampler import ShardedBatchSampler
        from lance.torch.data import LanceDataset

        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info else 1
        shard = self.case.rank * workers + (info.id if info else 0)
        sampler = ShardedBatchSampler(
            shard, self.case.world_size * workers, randomize=True, seed=SEED
        )
        ds = LanceDataset(
            lance_path(),
            batch_size=self.case.batch_size,
            columns=list(COLUMNS),
            sampler=sampler,
            auto_detect_rank=False,
        )
        yield from ds


def lance_torch(case: Case) -> Result:
    """lance.torch LanceDataset with ShardedBatchSampler (shuffled batch-sized ranges)."""
    import lance.torch.data  # noqa: F401  (imported here so its cost is not timed)

    kw = _torch_kwargs(case, SPAWN)
    kw["batch_size"] = None  # LanceDataset yields whole batches

    def make() -> Any:
        return torch.utils.data.DataLoader(LanceTorchShard(case), **kw)

    return drain(make, _dict_rows, case)


READERS: dict[str, Callable[[Case], Result]] = {
    "ours": ours,
    "ours_random": ours_random,
    "ours_s2": ours_s2,
    "ours_resume": ours_resume,
    "raw_take": raw_take,
    "raw_take_threads": raw_take_threads,
    "raw_take_reads": raw_take_reads,
    "raw_take_s2": raw_take_s2,
    "raw_random": raw_random,
    "raw_take_clumps": raw_take_clumps,
    "raw_range": raw_range,
    "lancedb_streaming": lancedb_streaming,
    "lancedb_streaming_default": lancedb_streaming_default,
    "litdata": litdata,
    "mosaic": mosaic,
    "mosaic_resume": mosaic_resume,
    "lance_torch": lance_torch,
    "ours_s3": ours_s3,
    "raw_take_s3": raw_take_s3,
}
