"""Placing rows of a read into a batch buffer: the copy a mixture makes once per column.

A mixture's read holds each dataset's rows in that dataset's stream order, and its batches
interleave the datasets' pieces; a NumPy copy per (batch, dataset) piece costs a Python call
each. `_gather_rows` fills a column of the whole read in one call, destination row after
destination row (each from the dataset read the layout names), so the buffer is written in
order as `np.take` writes a single table's. Columns are seen as unsigned words (rows, words
a row), so a few compiled signatures serve every dtype and width.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader.kernels.config import njit


@njit
def _gather_rows(
    srcs: tuple[NDArray[np.unsignedinteger[Any]], ...],
    which: NDArray[np.int64],
    rows: NDArray[np.int64],
    dest: NDArray[np.unsignedinteger[Any]],
) -> None:
    """dest[i] = srcs[which[i]][rows[i]] for every i (`srcs`: arrays of one type and width,
    one a dataset read). Writing `dest` in order measured ~20 % faster into a fresh buffer
    than a copy per dataset to its scattered places, and is one call for the whole column;
    an inner loop over the row's words (a row slice allocates a view each: ~5x slower)."""
    width = dest.shape[1]
    for i in range(which.shape[0]):
        src = srcs[which[i]]
        row = rows[i]
        for j in range(width):
            dest[i, j] = src[row, j]
