"""What StreamingDataLoader reads: one dataset, or a mixture of several.

Both give the loader the same things: a `progress` (the `Position` below), a reader with
`batches(task, sub_reads)`, `world`, `packing`, `plan.shuffle`, `source`,
`make_state(batching)` and `load_state_dict(state, drop_last)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, TypeAlias

from loader.dataset import StreamingDataset
from loader.mixture import MixedDataset
from loader.progress import Batching

Readable: TypeAlias = StreamingDataset | MixedDataset


class Stream(Protocol):
    """The rest of an epoch on one rank, as the loader hands it out."""

    epoch: int
    num_batches: int
    world_size: int

    def tasks(self, batches_per_read: int) -> Iterator[Any]: ...
    def global_rows(self, index: int) -> int: ...
    def task_rows(self, index: int) -> int: ...


class Position(Protocol):
    """Where a rank is: streams start here and record what reached the training loop."""

    step: int

    @property
    def epoch(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    def start(self, batching: Batching) -> Stream: ...
    def peek(self, batching: Batching) -> Stream: ...
    def is_current(self, stream: Any) -> bool: ...
    def record(self, stream: Any) -> None: ...
    def batches(self, batching: Batching) -> int: ...
