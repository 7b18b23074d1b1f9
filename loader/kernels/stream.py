"""The smallest-cursor-first stream over splits, and a rank's part of a step of it.

Taking from the split with the smallest cursor (ties: lowest index) emits the pairs
(cursor, split) in lexicographic order, so the stream is a walk over cursor levels, and a
split's rows in any stretch of it are consecutive (a run). That gives the kernels their
shape: `_advance` jumps over any number of rows with a binary search on the level (a
worker or a resumed rank starts at batch t in O(S log L), not by replaying t batches);
`_slice_runs` cuts a rank's positions out of a step laid out split-major; `_runs_order`
lists runs' rows in stream order (by level, then split).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.kernels.config import njit


@njit
def _rows_below(cursors: NDArray[np.int64], level: int, length: int) -> int:
    """How many stream rows lie at levels below `level`."""
    total = 0
    for s in range(cursors.shape[0]):
        top = min(level, length)
        if top > cursors[s]:
            total += top - cursors[s]
    return total


@njit
def _advance(cursors: NDArray[np.int64], consumed: int, length: int) -> NDArray[np.int64]:
    """Cursors after the stream from `cursors` has handed out `consumed` rows."""
    lo = cursors.min()
    hi = length
    while lo < hi:  # largest level with _rows_below(level) <= consumed
        mid = (lo + hi + 1) // 2
        if _rows_below(cursors, mid, length) <= consumed:
            lo = mid
        else:
            hi = mid - 1
    level = lo
    left = consumed - _rows_below(cursors, level, length)
    out = np.empty_like(cursors)
    for s in range(cursors.shape[0]):
        out[s] = max(cursors[s], level)
        if left > 0 and cursors[s] <= level < length:
            out[s] = level + 1
            left -= 1
    return out


@njit
def _slice_runs(
    before: NDArray[np.int64], after: NDArray[np.int64], lo: int, hi: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """A rank's part of one global step: positions [lo, hi) of the step's rows laid out
    split-major (split s's rows are its levels [before[s], after[s])), as runs
    (split, first level, stop level), ascending split."""
    splits = np.empty(before.shape[0], dtype=np.int64)
    starts = np.empty(before.shape[0], dtype=np.int64)
    stops = np.empty(before.shape[0], dtype=np.int64)
    runs = 0
    offset = 0  # position of split s's first row in the step's layout
    for s in range(before.shape[0]):
        count = after[s] - before[s]
        first = max(lo - offset, 0)
        last = min(hi - offset, count)
        if first < last:
            splits[runs] = s
            starts[runs] = before[s] + first
            stops[runs] = before[s] + last
            runs += 1
        offset += count
        if offset >= hi:
            break
    return splits[:runs], starts[:runs], stops[:runs]


@njit
def _runs_order(
    splits: NDArray[np.int64], starts: NDArray[np.int64], stops: NDArray[np.int64], length: int
) -> NDArray[np.int64]:
    """Order indices (split * length + level) of runs, by level, then split: the order in
    which the smallest-cursor-first stream walks them."""
    total = 0
    for r in range(splits.shape[0]):
        total += stops[r] - starts[r]
    out = np.empty(total, dtype=np.int64)
    if total == 0:
        return out
    level = starts.min()
    filled = 0
    while filled < total:
        upcoming = -1
        for r in range(splits.shape[0]):
            if starts[r] <= level < stops[r]:
                out[filled] = splits[r] * length + level
                filled += 1
            elif starts[r] > level and (upcoming < 0 or starts[r] < upcoming):
                upcoming = starts[r]
        level += 1
        if upcoming > level:
            live = False
            for r in range(splits.shape[0]):
                if starts[r] <= level < stops[r]:
                    live = True
                    break
            if not live:  # a gap of levels no run covers: jump it
                level = upcoming
    return out


@njit
def _task_order(
    runs: NDArray[np.int64], run_counts: NDArray[np.int64], length: int
) -> NDArray[np.int64]:
    """`_runs_order` of each batch of a task end to end (batch b: the next run_counts[b]
    rows of `runs`, columns split, first level, stop level): a task's order indices in one
    call, not one a batch (a mixture's read makes one per dataset and batch)."""
    total = 0
    for r in range(runs.shape[0]):
        total += runs[r, 2] - runs[r, 1]
    out = np.empty(total, dtype=np.int64)
    first, filled = 0, 0
    for b in range(run_counts.shape[0]):
        stop = first + run_counts[b]
        part = _runs_order(runs[first:stop, 0], runs[first:stop, 1], runs[first:stop, 2], length)
        out[filled : filled + part.shape[0]] = part
        filled += part.shape[0]
        first = stop
    return out
