"""The row ids of a loader's batches, the way most loader tests compare what was read, and
ranks stepped together in one process."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def ids(batches: Iterable[Any]) -> list[list[int]]:
    """Each batch's `id` column as a list: the batches and their order."""
    return [batch["id"].tolist() for batch in batches]


def flat_ids(batches: Iterable[Any]) -> list[int]:
    """Every batch's ids in one list: the rows and their order."""
    return [i for batch in ids(batches) for i in batch]


def step_together(ranks: list[Any], steps: int) -> list[list[Any]]:
    """`steps` batches of every rank's loader, rank by rank each step (as DDP ranks move in
    step), then every loader closed; each rank's batches."""
    running = [iter(dl) for dl in ranks]
    got: list[list[Any]] = [[] for _ in ranks]
    for _ in range(steps):
        for rank, it in enumerate(running):
            got[rank].append(next(it))
    for dl in ranks:
        dl.close()
    return got


def step_through_epochs(ranks: list[Any], steps: int) -> list[list[Any]]:
    """`steps` batches of every rank's loader, rank by rank each step, epoch after epoch (a
    new `for` over a loader as its epoch ends, as a training loop does); each rank's batches."""
    running = [iter(dl) for dl in ranks]
    got: list[list[Any]] = [[] for _ in ranks]
    for _ in range(steps):
        for rank, dl in enumerate(ranks):
            batch = next(running[rank], None)
            if batch is None:
                running[rank] = iter(dl)
                batch = next(running[rank])
            got[rank].append(batch)
    return got
