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
`_mix_labels` walks every row (O(rows * K)) and says which source each goes to: the order in
which a mixture's step lays its rows out (interleaved), so any slice of it holds each source
within two rows of its share.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.kernels.config import njit

PERIOD_LIMIT = 2**31  # D**2 must fit int64


@njit
def _mix_walk(
    weights: NDArray[np.int64],
    period: int,
    residual: NDArray[np.int64],
    row: int,
    rows: int,
    labels: NDArray[np.int64],
    at: int,
) -> int:
    """Walk `rows` rows inside one period from `row` rows into it; `residual` (counts inside
    the period) is updated in place, and when `labels` is not empty, the source of each row
    walked is written to labels[at], labels[at + 1], ... Returns the row reached."""
    keep = labels.shape[0] > 0
    for i in range(rows):
        at_row = row + 1  # the row being placed, 1-based within the period
        best = -1
        best_deadline = 0
        for k in range(weights.shape[0]):
            share = weights[k]
            job = residual[k] + 1
            if share == 0 or job > share:
                continue
            release = (job - 1) * period // share + 1
            if release > at_row:
                continue
            deadline = -(-(job * period) // share)
            if best < 0 or deadline < best_deadline:
                best = k
                best_deadline = deadline
        residual[best] += 1
        if keep:
            labels[at + i] = best
        row += 1
    return row


@njit
def _mix_run(
    weights: NDArray[np.int64],
    period: int,
    counts: NDArray[np.int64],
    rows: int,
    labels: NDArray[np.int64],
) -> NDArray[np.int64]:
    """Counts per source after `rows` more rows of the phase whose counts so far are
    `counts`; with a non-empty `labels` (of length `rows`), also each row's source."""
    done = counts.sum()
    periods = done // period
    residual = counts - periods * weights
    row = done - periods * period
    keep = labels.shape[0] > 0
    walked = 0
    while walked < rows:
        if row == period:
            periods += 1
            residual[:] = 0
            row = 0
        step = min(rows - walked, period - row)  # to the end of the current period
        if not keep and row == 0 and step == period:  # whole periods: skipped in O(K)
            whole = (rows - walked) // period
            periods += whole
            walked += whole * period
            continue
        row = _mix_walk(weights, period, residual, row, step, labels, walked)
        walked += step
    return residual + periods * weights


@njit
def _mix_counts(
    weights: NDArray[np.int64], period: int, counts: NDArray[np.int64], rows: int
) -> NDArray[np.int64]:
    """Counts per source after `rows` more rows of the phase whose counts so far are `counts`."""
    return _mix_run(weights, period, counts, rows, np.empty(0, dtype=np.int64))


@njit
def _mix_labels(
    weights: NDArray[np.int64], period: int, counts: NDArray[np.int64], rows: int
) -> NDArray[np.int64]:
    """The source of each of the next `rows` rows of the phase whose counts so far are
    `counts` (int64, in row order): the interleaved layout of a step or a rank's slice.
    The sequence repeats every period: when `rows` spans two periods or more, one period is
    walked and repeated (O(period * K + rows), not O(rows * K))."""
    labels = np.empty(rows, dtype=np.int64)
    if rows == 0:
        return labels
    if rows < 2 * period:
        _mix_run(weights, period, counts, rows, labels)
        return labels
    pattern = np.empty(period, dtype=np.int64)
    _mix_walk(weights, period, np.zeros_like(weights), 0, period, pattern, 0)
    done = counts.sum()
    row = done % period
    residual = counts - (done // period) * weights
    for i in range(row):  # counts off the sequence (never from a run): walk them as given
        residual[pattern[i]] -= 1
    if np.any(residual != 0):
        _mix_run(weights, period, counts, rows, labels)
        return labels
    for i in range(rows):
        labels[i] = pattern[(row + i) % period]
    return labels
