"""The row ids of a loader's batches, the way most loader tests compare what was read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def ids(batches: Iterable[Any]) -> list[list[int]]:
    """Each batch's `id` column as a list: the batches and their order."""
    return [batch["id"].tolist() for batch in batches]


def flat_ids(batches: Iterable[Any]) -> list[int]:
    """Every batch's ids in one list: the rows and their order."""
    return [i for batch in ids(batches) for i in batch]
