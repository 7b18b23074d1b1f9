"""How the loader's tasks meet torch's DataLoader: a Dataset indexed by tasks (whichever
process reads one computes its rows from the plan), the sampler that yields the current
stream's tasks, and a read's batches tagged with their place in the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler

from loader import batching
from loader.progress import Batching
from loader.readable import Position, Readable, Stream


def pinned(batch: Any) -> Any:
    if isinstance(batch, dict):
        # tensors, and Ragged columns (which pin their values and offsets)
        return {k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in batch.items()}
    return batch.pin_memory() if isinstance(batch, torch.Tensor) else batch


def pinned_read(read: Sequence[Any]) -> Sequence[Any]:
    """A read in pinned memory: its whole columns once (a SlicedRead), else batch by batch."""
    pin = getattr(read, "pin_memory", None)
    return pin() if pin is not None else [pinned(batch) for batch in read]


def as_is(batch: Any) -> Any:
    """Batches arrive collated from the reader; torch must not collate them again."""
    return batch


class TaskRead(Sequence[tuple[int, Any]]):
    """A read's batches as (index in the stream, batch): batches arriving out of order
    (in_order=False) are recorded as what they are. It pickles and pins as the read it
    wraps (a SlicedRead's whole columns, once)."""

    def __init__(self, first: int, read: Sequence[Any]) -> None:
        self.first, self.read = first, read

    def __len__(self) -> int:
        return len(self.read)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self.read):
            raise IndexError(f"batch {index} of a read of {len(self.read)}")
        return self.first + index, self.read[index]

    def pin_memory(self) -> TaskRead:
        return TaskRead(self.first, pinned_read(self.read))


class BatchReads(Dataset[TaskRead]):
    """What torch (and its workers) index with tasks: the dataset's own reader, always the
    one it currently pins, plus the loader's batch_transform."""

    def __init__(
        self,
        dataset: Readable,
        batch_transform: Callable[[Any], Any] | None,
        sub_reads: int = 1,
    ) -> None:
        self.streaming_dataset = dataset
        self.batch_transform = batch_transform
        self.sub_reads = sub_reads  # in a worker: each read cut into this many at once

    def __getitem__(self, task: Any) -> TaskRead:  # a BatchTask, or a mixture's MixTask
        """The task's batches, each with its index in the stream (so batches that arrive out
        of order, `in_order=False`, are recorded as what they are)."""
        reader: Any = self.streaming_dataset.reader  # a mixture's reads MixTasks
        batches: Sequence[Any] = reader.batches(task, self.sub_reads)
        if self.batch_transform is not None:
            batches = [self.batch_transform(batch) for batch in batches]
        return TaskRead(task.index, batches)

    def __len__(self) -> int:  # keys are tasks, not 0..n-1; the sampler knows how many
        raise TypeError(
            "the loader's reads are indexed by tasks, not 0..n-1: ask the loader its length, "
            "len(loader)"
        )


class TaskSampler(DistributedSampler[Any]):
    """Yields the tasks of the current stream (main process only). It refers to the
    progress, not the loader, so a loader is freed as soon as it is dropped.

    It is a DistributedSampler because it is one: it yields only this process's share.
    Frameworks that add one where a loader has none (Lightning's Fabric and Trainer, with
    their default `use_distributed_sampler=True`) see it and leave the loader as it is
    instead of rebuilding it around a sampler of their own. DistributedSampler's own
    `__init__` (a dataset to index, a seed) does not apply and is not called.
    """

    def __init__(self, progress: Position, batching: Batching, batches_per_read: int) -> None:
        self._progress = progress
        self._batching = batching
        self.batches_per_read = batches_per_read
        self.stream: Stream | None = None

    def __iter__(self) -> Iterator[Any]:
        assert self.stream is not None, "the loader starts a stream before torch asks for tasks"
        return batching.pending_tasks(self.stream, self._progress, self.batches_per_read)

    def __len__(self) -> int:
        return -(-self._progress.peek(self._batching).num_batches // self.batches_per_read)

    def set_epoch(self, epoch: int) -> None:
        """Ignored: the loader's position decides the epoch. Fabric calls this with its count
        of `for` loops over the loader, which restarts at 0 after a resume."""
