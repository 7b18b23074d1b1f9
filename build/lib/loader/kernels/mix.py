"""How many rows each source of a mixture supplies: an exact row sequence, earliest deadline first.

Weights are integers a_k with period D = sum(a_k) (source k's share is a_k / D). Row i of a
weight phase (1-based) goes to one source, and after any i rows source k has supplied
c_k(i) in {floor(i*a_k/D), ceil(i*a_k/D)}: within one row of its share, never ahead or
behind by a whole row, and c_k only grows. Such a sequence exists for any weights
(Tijdeman's chairman assignment theorem, whose bound is below 1); earliest deadline first
finds one: source k's j-th row may go no earlier than row floor((j-1)*D/a_k) + 1 (else it
would be ahead) and no later than row ceil(j*D/a_k) (else behind), and every row goes to
the released job with the earliest deadline (ties: the lowest source). Unit jobs with
integer release times and deadlines on one machine: EDF meets every deadline when any
schedule does.

Rounding a global batch's share step by step (largest remainder on cumulative targets)
is not enough: it can need a source to give back a row it already supplied (the Alabama
paradox). Working row by row avoids that, and the sequence is periodic: after D rows every
source has supplied exactly a_k, so whole periods are skipped in O(K) and only the
remainder is walked (O(min(rows, 2*D) * K)), with every product below D**2 <= 2**62.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.kernels.config import njit

PERIOD_LIMIT = 2**31  # D**2 must fit int64


@njit
def _mix_walk(
    weights: NDArray[np.int64], period: int, residual: NDArray[np.int64], row: int, rows: int
) -> int:
    """Walk `rows` rows inside one period from `row` rows into it; `residual` (counts inside
    the period) is updated in place. Returns the row reached."""
    for _ in range(rows):
        at = row + 1  # the row being placed, 1-based within the period
        best = -1
        best_deadline = 0
        for k in range(weights.shape[0]):
            share = weights[k]
            job = residual[k] + 1
            if share == 0 or job > share:
                continue
            release = (job - 1) * period // share + 1
            if release > at:
                continue
            deadline = -(-(job * period) // share)
            if best < 0 or deadline < best_deadline:
                best = k
                best_deadline = deadline
        residual[best] += 1
        row += 1
    return row


@njit
def _mix_counts(
    weights: NDArray[np.int64], period: int, counts: NDArray[np.int64], rows: int
) -> NDArray[np.int64]:
    """Counts per source after `rows` more rows of the phase whose counts so far are `counts`."""
    done = counts.sum()
    periods = done // period
    residual = counts - periods * weights
    row = done - periods * period
    first = min(rows, period - row)  # to the end of the current period
    row = _mix_walk(weights, period, residual, row, first)
    left = rows - first
    if row == period:
        periods += 1
        residual[:] = 0
        row = 0
    periods += left // period
    _mix_walk(weights, period, residual, row, left % period)
    return residual + periods * weights
