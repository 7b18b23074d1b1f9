"""Pure arithmetic of the contract that the dashboard draws: who owns which split, which
world sizes fit, what a layout drops, and who is straggling.

Who owns which split comes from `loader.layout` (standard library only), so the Streamlit
process and the collector share the loader's formulas without importing torch or Numba.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loader.layout import owned_splits, supported_world_sizes

__all__ = ["owned_splits", "owners", "supported_world_sizes"]


def owners(world_size: int, num_splits: int) -> list[int]:
    """`owners(W, S)[s]` is the rank that reads split s."""
    owned_splits(0, world_size, num_splits)  # validates: a ValueError listing what works
    k = num_splits // world_size
    return [s // k for s in range(num_splits)]


@dataclass(frozen=True)
class Fit:
    """What one candidate GPU count means for a (rows, S, global batch) layout."""

    world_size: int
    fits: bool
    reason: str
    per_rank_batch: int | None
    batches_per_epoch: int | None
    elastic: bool


def plan_fits(
    rows: int, num_splits: int, world_sizes: Iterable[int], global_batch: int, drop_last: bool
) -> tuple[int, list[Fit]]:
    """Rows dropped per epoch (`N - S·⌊N/S⌋`) and, per W, whether and how it fits.

    `elastic` says whether G is a multiple of S: only then is global batch t the same rows
    for every W (design.md, "Elastic determinism").
    """
    if num_splits < 1 or rows < num_splits:
        raise ValueError(f"need rows >= num_splits >= 1, got rows={rows}, num_splits={num_splits}")
    per_split = rows // num_splits
    dropped = rows - per_split * num_splits
    elastic = global_batch % num_splits == 0
    fits = []
    for w in world_sizes:
        why = ""
        if w < 1 or num_splits % w:
            why = f"S={num_splits} is not a multiple of W"
        elif global_batch % w:
            why = f"G={global_batch} is not a multiple of W"
        if why:
            fits.append(Fit(w, False, why, None, None, elastic))
            continue
        b = global_batch // w
        stream = per_split * (num_splits // w)
        batches = stream // b if drop_last else -(-stream // b)
        fits.append(Fit(w, True, "fits", b, batches, elastic))
    return dropped, fits


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
