"""What only the dashboard computes: the owner of every split (for the placement grid) and
who is straggling.

Everything else about a layout is the loader's: `loader.layout` (who owns which split,
which world sizes S supports) and `loader.planner` (which world sizes fit a global batch),
both standard library only, so the Streamlit process and the collector import them
without torch or Numba.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from loader.layout import owned_splits

__all__ = ["RankRate", "owners", "stragglers"]


def owners(world_size: int, num_splits: int) -> list[int]:
    """`owners(W, S)[s]` is the rank that reads split s."""
    owned_splits(0, world_size, num_splits)  # validates: a ValueError listing what works
    k = num_splits // world_size
    return [s // k for s in range(num_splits)]


@dataclass(frozen=True)
class RankRate:
    rank: int
    rows_per_s: float
    stall_frac: float


def stragglers(rates: Sequence[RankRate], slow: float = 0.8, stall: float = 0.1) -> list[str]:
    """Reason per rank ('' = fine): under `slow` × the median rate, or waiting for data
    more than `stall` of the time and twice the median. In a DDP job collectives equalise
    rows/s, so the data-wait share is the signal that names the rank holding others back.
    """
    if len(rates) < 2:
        return ["" for _ in rates]
    med_rate = statistics.median(r.rows_per_s for r in rates)
    med_stall = statistics.median(r.stall_frac for r in rates)
    reasons = []
    for r in rates:
        why = []
        if med_rate > 0 and r.rows_per_s < slow * med_rate:
            why.append(f"{r.rows_per_s:,.0f} rows/s < {slow:.0%} of median {med_rate:,.0f}")
        if r.stall_frac > stall and r.stall_frac > 2 * med_stall:
            why.append(f"waits for data {r.stall_frac:.0%} of the time")
        reasons.append("; ".join(why))
    return reasons
