"""What StreamingDataLoader reads: one dataset, or a mixture of several.

Both give the loader the same things: a `progress` (the `Position` below), a reader with
`batches(task, sub_reads)`, `world`, `packing`, `plan.shuffle`, `source`,
`make_state(batching)` and `load_state_dict(state, drop_last)`.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias

from loader.dataset import StreamingDataset
from loader.layout import check_world_size
from loader.mixture.dataset import MixedDataset
from loader.progress import Batching
from loader.skips import SkipRanges

Readable: TypeAlias = StreamingDataset | MixedDataset


class Stream(Protocol):
    """The rest of an epoch on one rank, as the loader hands it out."""

    epoch: int
    num_batches: int
    world_size: int

    def task(self, index: int, batches: int = 1) -> Any: ...
    def global_rows(self, index: int) -> int: ...
    def task_rows(self, index: int) -> int: ...


class Position(Protocol):
    """Where a rank is: streams start here and record what reached the training loop
    (`loader.progress.Progress` for a dataset, `loader.mixture.stream.MixProgress` for a mixture)."""

    step: int
    skips: SkipRanges
    steps_skipped: list[list[int]]

    @property
    def epoch(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def ended(self) -> bool: ...
    def position(self) -> tuple[int, tuple[int, ...], int]: ...
    def start(self, batching: Batching) -> Any: ...
    def peek(self, batching: Batching) -> Any: ...
    def is_current(self, stream: Any) -> bool: ...
    def handed_out(self, index: int) -> bool: ...
    def record(self, stream: Any, index: int | None = None) -> None: ...
    def frontier(self) -> int: ...
    def skip_due(self) -> bool: ...
    def issue_limit(self, stream: Any) -> int: ...
    def apply_skips(self, batching: Batching) -> None: ...
    def batches(self, batching: Batching) -> int: ...


def check_fits(dataset: Readable, world_size: int, global_batch: int) -> None:
    """Raise unless W ranks read this dataset with global batch G. A mixture's step is one
    layout of G rows: any W <= G (its datasets' S do not matter)."""
    splits = dataset.num_splits if isinstance(dataset, StreamingDataset) else 1
    check_world_size(splits, world_size, global_batch)


def placed_as(dataset: Readable, global_batch: int) -> dict[str, int]:
    """What the collector places: S splits of L rows; a mixture, one layout of G positions
    a step (its per-dataset facts go in `mixture` events)."""
    if isinstance(dataset, MixedDataset):
        return {"num_splits": global_batch}
    return {"num_splits": dataset.num_splits, "rows_per_split": dataset.rows_per_split}


def tell_mixture(
    reporter: Any, dataset: Readable, step: int, global_batch: int, live: bool = False
) -> None:
    """A mixture's weights, per-dataset progress and the next step's layout, for the
    dashboard's Timeline (not when `live`), Progress and Placement pages."""
    if isinstance(dataset, MixedDataset):
        facts = dataset.facts(global_batch)
        reporter.mixture(dataset.epoch, step, dataset.progress.global_step, facts, live)
