"""Counter-based clump permutation: a keyed Feistel bijection with cycle walking.

Why not `numpy.random.permutation`: its stream is not promised across NumPy versions, and
it needs all N positions up front. A keyed bijection maps any slot to its clump in O(1)
time and memory, so a rank computes just the rows it reads next: time to the first batch
does not grow with N, and the plan never holds O(N) anything. Eight rounds of a
SplitMix64-finalised round function mix well enough to pass the uniformity tests in
`tests/test_shuffle_quality.py`; cycle walking over the next power of four keeps the map a
bijection on exactly [0, n) at an expected cost of under four rounds of walking.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.kernels.config import njit

MASK64 = (1 << 64) - 1
ROUNDS = 8
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(value: int) -> int:
    """SplitMix64's finaliser on a Python int (used to derive round keys)."""
    z = value & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def round_keys(seed: int, epoch: int, n: int, clump: int) -> NDArray[np.uint64]:
    """Round keys that depend on (seed, epoch, n, clump) only, identical on every machine."""
    state = mix64(seed ^ 0x5EED5EED5EED5EED)
    for word in (epoch, n, clump):
        state = mix64(state ^ mix64(word + 0x9E3779B97F4A7C15))
    keys = [mix64(state + (i + 1) * 0x9E3779B97F4A7C15) for i in range(ROUNDS)]
    return np.array(keys, dtype=np.uint64)


def half_bits_for(n: int) -> int:
    """Half the bits of the smallest power of four (at least 4) that holds [0, n)."""
    bits = max(1, (n - 1).bit_length())
    return max(1, (bits + 1) // 2)


@njit
def _mix(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit
def _feistel(x: np.uint64, keys: NDArray[np.uint64], half: np.uint64) -> np.uint64:
    mask = (np.uint64(1) << half) - np.uint64(1)
    left = x >> half
    right = x & mask
    for i in range(keys.shape[0]):
        left, right = right, left ^ (_mix(right ^ keys[i]) & mask)
    return (left << half) | right


@njit
def _feistel_inverse(x: np.uint64, keys: NDArray[np.uint64], half: np.uint64) -> np.uint64:
    mask = (np.uint64(1) << half) - np.uint64(1)
    left = x >> half
    right = x & mask
    for i in range(keys.shape[0] - 1, -1, -1):
        left, right = right ^ (_mix(left ^ keys[i]) & mask), left
    return (left << half) | right


@njit
def _cycle_walk(
    x: int, n: int, keys: NDArray[np.uint64], half_bits: int, inverse: bool
) -> np.int64:
    """Apply the Feistel network (or its inverse) until the value falls back inside [0, n)."""
    half = np.uint64(half_bits)
    bound = np.uint64(n)
    y = np.uint64(x)
    while True:
        y = _feistel_inverse(y, keys, half) if inverse else _feistel(y, keys, half)
        if y < bound:
            return np.int64(y)


@njit
def _permute(i: int, n: int, keys: NDArray[np.uint64], half_bits: int) -> np.int64:
    """The clump in slot i: the bijection on [0, n)."""
    return _cycle_walk(i, n, keys, half_bits, False)


@njit
def _unpermute(j: int, n: int, keys: NDArray[np.uint64], half_bits: int) -> np.int64:
    """The inverse of `_permute`: which slot holds clump j."""
    return _cycle_walk(j, n, keys, half_bits, True)


@njit
def _slot_of(i: int, clump: int, short_slot: int, short_len: int) -> tuple[int, int]:
    """(slot, offset in its clump) of order index i.

    Slots hold clumps of `clump` positions, except the slot `short_slot` that holds the
    last, shorter clump (`short_len` rows; `short_len == clump` when there is none).
    """
    start_short = short_slot * clump
    end_short = start_short + short_len
    if i < start_short:
        return i // clump, i % clump
    if i < end_short:
        return short_slot, i - start_short
    j = i - end_short
    return short_slot + 1 + j // clump, j % clump


@njit
def _order_positions(
    order_idx: NDArray[np.int64],
    clump: int,
    n_clumps: int,
    short_slot: int,
    short_len: int,
    keys: NDArray[np.uint64],
    half_bits: int,
) -> NDArray[np.int64]:
    """Positions `order[order_idx]` of a clump-shuffled order, without building the order."""
    out = np.empty(order_idx.shape[0], dtype=np.int64)
    last_slot, last_clump = -1, np.int64(0)
    for t in range(order_idx.shape[0]):
        slot, offset = _slot_of(order_idx[t], clump, short_slot, short_len)
        if slot != last_slot:  # consecutive rows of one clump share its permutation
            last_slot, last_clump = slot, _permute(slot, n_clumps, keys, half_bits)
        out[t] = last_clump * clump + offset
    return out


@njit
def _order_range(
    start: int,
    count: int,
    clump: int,
    n_clumps: int,
    short_slot: int,
    short_len: int,
    keys: NDArray[np.uint64],
    half_bits: int,
) -> NDArray[np.int64]:
    """Positions `order[start:start + count]`, with no array of indices (a rank's whole plan).

    The loop repeats `_order_positions` on purpose: the clump cache must stay in locals
    (registers); sharing the body through a helper with an array cache measured 3-5x slower.
    """
    out = np.empty(count, dtype=np.int64)
    last_slot, last_clump = -1, np.int64(0)
    for t in range(count):
        slot, offset = _slot_of(start + t, clump, short_slot, short_len)
        if slot != last_slot:
            last_slot, last_clump = slot, _permute(slot, n_clumps, keys, half_bits)
        out[t] = last_clump * clump + offset
    return out


_SEED_SALT = np.uint64(0x5EED5EED5EED5EED)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit
def _round_keys(seed: np.uint64, epoch: int, n: int, clump: int) -> NDArray[np.uint64]:
    """`round_keys` compiled (uint64 arithmetic wraps as the Python one masks)."""
    state = _mix(seed ^ _SEED_SALT)
    for word in (np.uint64(epoch), np.uint64(n), np.uint64(clump)):
        state = _mix(state ^ _mix(word + _GOLDEN))
    keys = np.empty(ROUNDS, dtype=np.uint64)
    for i in range(ROUNDS):
        keys[i] = _mix(state + np.uint64(i + 1) * _GOLDEN)
    return keys


@njit
def _passes_positions(
    order_idx: NDArray[np.int64],
    seed: np.uint64,
    first_epoch: int,
    passes: int,
    n: int,
    clump: int,
    n_clumps: int,
    short_len: int,
    half_bits: int,
) -> NDArray[np.int64]:
    """`order[order_idx]` in each of `passes` epochs from `first_epoch`, end to end: a small
    dataset read many times over in one step without Python per pass (each epoch's keys and
    short slot derived here, as `EpochPlan` derives them)."""
    m = order_idx.shape[0]
    out = np.empty(passes * m, dtype=np.int64)
    for p in range(passes):
        keys = _round_keys(seed, first_epoch + p, n, clump)
        short_slot = _unpermute(n_clumps - 1, n_clumps, keys, half_bits)
        part = _order_positions(
            order_idx, clump, n_clumps, int(short_slot), short_len, keys, half_bits
        )
        out[p * m : (p + 1) * m] = part
    return out
