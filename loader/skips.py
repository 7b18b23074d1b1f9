"""Global steps to skip (`StreamingDataLoader.skip_steps`): the ranges not yet reached.

Megatron's `--skip-train-iteration-range`, as users want it (Megatron-DeepSpeed #230):
absolute ranges of global steps that survive restarts. A range not yet reached is part of
the state (`skips_pending`), so a resume on any W skips it without the job registering it
again, and a job that registers its ranges at every start (from a config) changes nothing:
a range already pending, or already skipped, is a no-op. Ranges are kept merged and sorted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class SkipRanges:
    """Disjoint, sorted global-step ranges [start, stop) still to jump over."""

    def __init__(self, ranges: Iterable[Sequence[int]] = ()) -> None:
        self._ranges: list[tuple[int, int]] = []
        for start, stop in ranges:
            self.add(start, stop)

    def add(self, start: int, stop: int) -> None:
        """Add [start, stop), merged with the ranges it touches (adding one twice: no change)."""
        if start >= stop:
            return
        merged = []
        for a, b in self._ranges:
            if b < start or a > stop:
                merged.append((a, b))
            else:
                start, stop = min(a, start), max(b, stop)
        merged.append((start, stop))
        self._ranges = sorted(merged)

    def covers(self, start: int, stop: int) -> bool:
        """Whether one range holds all of [start, stop)."""
        return any(a <= start and stop <= b for a, b in self._ranges)

    def due(self, step: int) -> int | None:
        """The stop of the range holding `step`, or None."""
        return next((b for a, b in self._ranges if a <= step < b), None)

    def next_start(self, step: int) -> int | None:
        """The first step at or after `step` that a range skips, or None."""
        return next((max(a, step) for a, b in self._ranges if b > step), None)

    def pending(self, step: int) -> list[list[int]]:
        """The ranges (or their parts) at or after `step`: what the state keeps."""
        return [[max(a, step), b] for a, b in self._ranges if b > step]

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __repr__(self) -> str:
        return f"SkipRanges({self._ranges})"


def already_skipped(start: int, stop: int, skipped: Iterable[Sequence[Any]]) -> bool:
    """Whether every step of [start, stop) lies in ranges jumped already (`steps_skipped`
    entries begin with start, stop): registering such a range again is a no-op."""
    step = start
    for first, last in sorted((int(r[0]), int(r[1])) for r in skipped):
        if first <= step < last:
            step = last
    return step >= stop
