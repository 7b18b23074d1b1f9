"""StreamingDataLoader: a torch DataLoader whose batches follow the elastic order.

The loader samples `BatchTask`s, not row indices: the main process turns "batch t of
this rank" into a small task (the rank's cursors before t, and a count), and whichever
process reads it (the main one, or any worker) computes the rows from the plan alone. So
the batch sequence is the same for any num_workers, workers share nothing, and the state
is what the training loop received, never what workers prefetched.
"""

from __future__ import annotations

import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from loader.dataset import StreamingDataset
from loader.prefetch import auto_reads_in_flight, check_reads_in_flight, map_ahead
from loader.reader import BatchReader
from loader.stream import BatchTask, RankStream

_REFUSED = ("shuffle", "sampler", "batch_sampler")


def _clean_worker_context() -> BaseContext:
    """Forkserver, preloaded with the reader's imports: workers start fast and clean.

    A plain fork copies a parent whose Lance runtime has live threads (it opened and read
    the table); that child can crash or deadlock. Forkserver children fork from a process
    that imported Lance but never ran it. Pass multiprocessing_context="fork" to opt out.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["loader.reader", "lance"])
    return context


def _pinned(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch.pin_memory() if isinstance(batch, torch.Tensor) else batch


def _as_is(batch: Any) -> Any:
    """Batches arrive collated from the reader; torch must not collate them again."""
    return batch


class _TaskSampler(Sampler[BatchTask]):
    """Yields the tasks of the loader's current stream (lives in the main process only)."""

    def __init__(self, loader: StreamingDataLoader) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[BatchTask]:
        stream = self._loader._stream
        assert stream is not None, "the loader starts a stream before torch asks for tasks"
        return stream.tasks(self._loader.batches_per_read)

    def __len__(self) -> int:
        return -(-self._loader._peek().num_batches // self._loader.batches_per_read)


class StreamingDataLoader(DataLoader[Any]):
    """Batches of `batch_size` rows from a StreamingDataset, stateful and elastic.

    Args:
        dataset: the StreamingDataset of this rank.
        batch_size: rows per batch on this rank (the global batch is W * batch_size).
        num_workers: worker processes; they change nothing in what is yielded.
        drop_last: drop this epoch's final short batch.
        batch_transform: called on each batch dict inside the worker.
        telemetry, run_id: collector URL and run name (default: ELASTIC_LOADER_TELEMETRY,
            ELASTIC_LOADER_RUN_ID); no URL anywhere means no telemetry.
        reads_in_flight: reads running at once in each reading process, to hide the
            store's latency: with num_workers=0 the next reads run ahead in threads; in a
            worker each read is cut into that many sub-reads. None: 16 for an object store
            (shared among workers, at least 2 each), 4 locally with no workers, 1 in a
            local worker. 0: no threads. The batches and the state are the same whatever
            it is; memory in flight is at most about reads_in_flight + 2 reads per process.
            (Replaces `read_ahead`, still accepted with a warning.)
        read_size: rows per read: consecutive batches are read together (one sorted read
            in which each split's rows form one run) and handed out one by one. The batches
            are the same whatever it is; it trades memory in flight for fewer, longer reads.
        **kwargs: passed to torch's DataLoader (pin_memory, persistent_workers,
            prefetch_factor, multiprocessing_context, timeout, ...).
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        batch_size: int = 1,
        num_workers: int = 0,
        drop_last: bool = False,
        *,
        batch_transform: Callable[[dict[str, Any]], Any] | None = None,
        telemetry: str | None = None,
        run_id: str | None = None,
        reads_in_flight: int | None = None,
        read_size: int = 8192,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise TypeError(
                f"StreamingDataLoader needs a StreamingDataset, got {type(dataset).__name__}"
            )
        refused = [k for k in _REFUSED if k in kwargs]
        if refused:
            raise ValueError(
                f"{refused} are decided by the plan (shuffle=/shuffle_seed= on the dataset)"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.streaming_dataset = dataset
        self._rows_per_batch = batch_size
        self._drop_last = drop_last
        if "read_ahead" in kwargs:
            warnings.warn("read_ahead is now reads_in_flight", DeprecationWarning, stacklevel=2)
            reads_in_flight = kwargs.pop("read_ahead")
        check_reads_in_flight(reads_in_flight)
        if reads_in_flight is None:
            reads_in_flight = auto_reads_in_flight(dataset.source.spec.uri, num_workers)
        self.reads_in_flight = reads_in_flight
        self.batches_per_read = max(1, read_size // batch_size)
        self._stream: RankStream | None = None
        self._yielded = 0
        # batches of epoch `_base_epoch` handed out before the current iteration (earlier
        # `for` loops over the same epoch, or the run a state was saved from)
        self._base_epoch, self._base = dataset.epoch, 0
        self._started = False
        reader = BatchReader(
            dataset.source, dataset.plan, dataset.transform, dataset.on_error, batch_transform,
            reads_in_flight if num_workers > 0 else 1,
        )  # fmt: skip
        kwargs.setdefault("collate_fn", _as_is)
        if num_workers > 0 and kwargs.get("multiprocessing_context") is None:
            kwargs["multiprocessing_context"] = _clean_worker_context()
        super().__init__(
            reader, batch_size=None, sampler=_TaskSampler(self), num_workers=num_workers, **kwargs
        )
        self._telemetry = self._connect(telemetry, run_id)

    # DataLoader assigns batch_size/drop_last itself (None/False: batching happens in tasks);
    # these report the loader's own values.
    @property
    def batch_size(self) -> int:
        return self._rows_per_batch

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        if value is not None:
            raise AttributeError("batch_size is fixed at construction")

    @property
    def drop_last(self) -> bool:
        return self._drop_last

    @drop_last.setter
    def drop_last(self, value: Any) -> None:
        if value is not False:
            raise AttributeError("drop_last is fixed at construction")

    def _peek(self) -> RankStream:
        return self.streaming_dataset.peek_stream(self._rows_per_batch, self._drop_last)

    def __len__(self) -> int:
        """Batches of this epoch on this rank: those already handed out plus those to come.

        After a resume it still counts the whole epoch, as Lightning and progress bars expect.
        """
        return self.step + self._peek().num_batches

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self.streaming_dataset
        self._check_reader_version()
        self._started = True
        self._base_epoch, self._base = ds.position()[0], self.step
        stream = ds.start_stream(self._rows_per_batch, self._drop_last)
        self._stream, self._yielded = stream, 0
        waited = time.perf_counter()
        for batch in self._batches(stream):
            self._yielded += 1
            ds.record(stream, min(self._yielded * self._rows_per_batch, stream.rows))
            if self._telemetry is not None:
                now = time.perf_counter()
                self._telemetry.on_batch(stream.task_rows(self._yielded - 1), now - waited)
            yield batch
            waited = time.perf_counter()
        ds.record(stream, stream.rows)
        if self._telemetry is not None:
            self._telemetry.event("epoch_end", epoch=stream.epoch, step=self._base + self._yielded)

    def _batches(self, stream: RankStream) -> Iterator[Any]:
        """Batches one by one from reads of several: torch's iterator with workers, our
        threaded read-ahead without them."""
        if self.num_workers > 0 or self.reads_in_flight < 1:
            reads: Iterator[list[Any]] = super().__iter__()
        else:
            tasks = stream.tasks(self.batches_per_read)
            reads = map_ahead(self.dataset.__getitem__, tasks, self.reads_in_flight)
            if self.pin_memory and torch.cuda.is_available():
                reads = ([_pinned(batch) for batch in read] for read in reads)
        return (batch for read in reads for batch in read)

    def _check_reader_version(self) -> None:
        """A state loaded since construction may have re-pinned the dataset to another version."""
        reader = self.dataset
        assert isinstance(reader, BatchReader)
        if reader.source is not self.streaming_dataset.source:
            if self.persistent_workers and self.num_workers > 0 and self._started:
                raise RuntimeError(
                    "load_state_dict re-pinned the table version after persistent workers started; "
                    "create the StreamingDataLoader after loading the state"
                )
            reader.source, reader.plan = self.streaming_dataset.source, self.streaming_dataset.plan

    # -- state --------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """Batches of the current epoch handed to the training loop (across resumes)."""
        epoch = self.streaming_dataset.position()[0]
        if self._stream is not None:
            return self._base + self._yielded if self._stream.epoch == epoch else 0
        return self._base if self._base_epoch == epoch else 0

    def state_dict(self) -> dict[str, Any]:
        """Per-split cursors of the batches the training loop received; the same on every rank."""
        return self.streaming_dataset.make_state(self._rows_per_batch, self._drop_last, self.step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state` (any world size dividing num_splits); takes effect at the next `for`."""
        before = state.get("world_size") if isinstance(state, dict) else None
        self.streaming_dataset.load_state_dict(state, drop_last=self._drop_last)
        self._stream, self._yielded = None, 0
        epoch, cursors = self.streaming_dataset.position()
        mid_epoch = epoch == state.get("epoch") and any(cursors)
        step = state.get("step")
        self._base_epoch, self._base = epoch, (step if mid_epoch and isinstance(step, int) else 0)
        if self._telemetry is not None:
            self._telemetry.event(
                "checkpoint_loaded",
                world_size_before=before,
                world_size_after=self.streaming_dataset.world_size,
                step=state.get("step"),
                epoch=state.get("epoch"),
            )

    def note_checkpoint_saved(self, path: str | None = None) -> None:
        """Tell the dashboard a checkpoint was written (call after saving `state_dict()`)."""
        if self._telemetry is not None:
            self._telemetry.event(
                "checkpoint_saved",
                path=path,
                step=self.step,
                epoch=self.streaming_dataset.position()[0],
            )

    def close(self) -> None:
        """Flush and stop this loader's telemetry (bounded: about 2 s at most).

        Worth calling at the end of a rank: spawned and forkserver children skip atexit,
        so their last second of telemetry would be lost.
        """
        if self._telemetry is not None:
            self._telemetry.close()

    # -- telemetry ----------------------------------------------------------------------

    def _connect(self, url: str | None, run_id: str | None) -> Any:
        from loader.telemetry import TelemetryClient

        ds = self.streaming_dataset
        static = {
            "rank": ds.rank,
            "local_rank": ds.world.local_rank,
            "world_size": ds.world_size,
            "num_workers": self.num_workers,
            "num_splits": ds.num_splits,
            "rows_per_split": ds.rows_per_split,
            "batch_size": self._rows_per_batch,
        }
        client = TelemetryClient.from_settings(url, run_id, static)
        if client is not None:
            client.set_snapshot(self._snapshot)
        return client

    def _snapshot(self) -> dict[str, Any]:
        ds = self.streaming_dataset
        epoch, cursors = ds.position()
        splits = ds.splits
        return {
            "epoch": epoch,
            "step": self.step,
            "splits": [splits.start, splits.stop],
            "cursors": list(cursors[splits.start : splits.stop]),
        }
