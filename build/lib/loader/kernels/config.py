"""One place for the njit options of every kernel.

`cache=True` makes a fresh process load compiled kernels in milliseconds instead of
compiling for ~0.5 s each. No `parallel=True`: kernels also run inside forked DataLoader
workers, where GNU OpenMP aborts or hangs, and a rank's per-batch work is too small to
gain from threads. No `fastmath`: everything here is exact integer index arithmetic.
"""

from __future__ import annotations

import numba

njit = numba.njit(cache=True, nogil=True)
