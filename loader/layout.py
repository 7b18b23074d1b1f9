"""Who reads what: which world sizes a layout supports and which splits a rank owns.

Standard library only, so light processes (the dashboard's collector and Streamlit app)
share these formulas with the loader without importing torch or Numba.
"""

from __future__ import annotations

import math


def supported_world_sizes(num_splits: int) -> list[int]:
    """World sizes that divide `num_splits`, i.e. that a run with it can use, ascending.

    Divisors come in pairs (w, S/w) with w <= sqrt(S): O(sqrt(S)) steps, so even S = 2**40
    answers in a fraction of a second.
    """
    small = [w for w in range(1, math.isqrt(num_splits) + 1) if num_splits % w == 0]
    large = [num_splits // w for w in reversed(small) if w * w != num_splits]
    return small + large


def check_world_size(num_splits: int, world_size: int) -> None:
    """Raise a ValueError that lists the world sizes that work when W does not divide S."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if num_splits % world_size:
        raise ValueError(
            f"num_splits={num_splits} is not divisible by world_size={world_size}; "
            f"num_splits={num_splits} supports world sizes {supported_world_sizes(num_splits)}. "
            f"Pick num_splits as a common multiple of every GPU count you plan to use "
            f"(e.g. 48 supports 1, 2, 3, 4, 6, 8, 12, 16, 24, 48)."
        )


def owned_splits(rank: int, world_size: int, num_splits: int) -> range:
    """The contiguous splits rank `rank` reads: [r*S/W, (r+1)*S/W)."""
    check_world_size(num_splits, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]"
        )
    per_rank = num_splits // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)
