"""What only the dashboard computes: the placement grid's cells (who reads every split,
which splits two ranks share and who reads which part) and who is straggling.

Who reads what is the loader's: `loader.layout` (a rank's pieces of every global step,
which world sizes fit) and `loader.tools.planner` (which world sizes fit a global batch), both
standard library only, so the Streamlit process and the collector import them without
torch or Numba. This module only arranges their answer for drawing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loader.layout import fit_reason, is_whole, rank_pieces, slice_bounds, uses_steps
from loader.wire import text_list

__all__ = ["RankRate", "layout_of", "mixture_layout", "owners", "stragglers"]


def layout_of(world_size: int, num_splits: int, global_batch: int | None = None) -> dict[str, Any]:
    """The grid of W ranks over S splits with global batch G (None: the split layout).

    `owner[s]` is the first rank that reads split s (-1 for all when the layout is not
    known: W does not divide S and no rank said G); `shared` lists the splits read by more
    than one rank, each with its `parts`: rank and rows [start, stop) of the split's
    `rows_per_step` (G/S) rows in every full global step. O(S + W).
    """
    owner = [-1] * num_splits
    out: dict[str, Any] = {"global_batch_size": global_batch, "owner": owner, "shared": []}
    out["rows_per_step"] = rows_per_step(num_splits, global_batch)
    if fit_reason(num_splits, world_size, global_batch):
        return out
    parts: dict[int, list[dict[str, int]]] = {}
    for rank in range(world_size):
        for piece in rank_pieces(rank, world_size, num_splits, global_batch):
            if is_whole(piece, num_splits, global_batch):
                owner[piece.split : piece.split_stop] = [rank] * len(piece.splits)
                continue
            parts.setdefault(piece.split, []).append(
                {"rank": rank, "start": piece.start, "stop": piece.stop}
            )
            if owner[piece.split] < 0:
                owner[piece.split] = rank
    out["shared"] = [{"split": s, "parts": p} for s, p in sorted(parts.items())]
    return out


def mixture_layout(facts: dict[str, Any], world_size: int) -> dict[str, Any]:
    """A mixture's placement from its latest `mixture` event (`facts`, its data): per
    dataset its weight and splits and, for the global step the event describes, the
    positions of its rows in that step and which rank reads which of them (rank r reads
    positions [r·G/W, (r+1)·G/W) of every step: `loader.layout.slice_bounds`). Every rank
    reads a part of every dataset, so a mixture has no split-to-rank grid. O(K · W)."""
    names, weights = text_list(facts, "names"), text_list(facts, "weights")
    splits = list(facts.get("dataset_splits") or [])
    rows = list(facts.get("dataset_rows") or [])  # sent from issue 33 on
    flat = list(facts.get("step_segments") or [])
    datasets = [
        {"name": n, "weight": w, "splits": s, "rows": rows[k] if k < len(rows) else None,
         "segments": []}
        for k, (n, w, s) in enumerate(
            zip(names, weights, splits + [0] * (len(names) - len(splits)), strict=False)
        )
    ]  # fmt: skip
    step_rows = sum(flat[2::3])
    slices = [slice_bounds(r, world_size, step_rows) for r in range(world_size)]
    slices = slices if step_rows else []
    for k, start, count in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
        if not 0 <= k < len(datasets):
            continue  # an event from another mixture: nothing to place
        stop = start + count
        parts = [
            {"rank": r, "start": max(lo, start), "stop": min(hi, stop)}
            for r, (lo, hi) in enumerate(slices)
            if max(lo, start) < min(hi, stop)
        ]
        datasets[k]["segments"].append({"start": start, "stop": stop, "parts": parts})
    return {"rows_per_step": step_rows or None, "datasets": datasets}


def rows_per_step(num_splits: int, global_batch: int | None) -> int | None:
    """G/S, the rows of every split in a full global step of the step layout; else None."""
    if global_batch is None or not uses_steps(num_splits, global_batch):
        return None
    return global_batch // num_splits


def owners(world_size: int, num_splits: int, global_batch: int | None = None) -> list[int]:
    """`owners(W, S, G)[s]` is the (first) rank that reads split s; a ValueError saying what
    works when W cannot read S splits with G."""
    reason = fit_reason(num_splits, world_size, global_batch)
    if reason:
        raise ValueError(reason)
    owner: list[int] = layout_of(world_size, num_splits, global_batch)["owner"]
    return owner


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


# What the Planner shows with no run selected (the loader's own defaults where it has one).
PLANNER_DEFAULTS: dict[str, Any] = {
    "rows": 1_000_000, "num_splits": 48, "global_batch": 1536, "drop_last": False,
    "gpus": "1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 32, 48, 56, 64",
}  # fmt: skip


def planner_defaults(placement: dict[str, Any] | None, dataset: int = 0) -> dict[str, Any]:
    """The Planner's starting values from the selected run's placement view: its S, N (S × L:
    the rows its epoch reads; the surplus under S is not reported), G (the global batch its
    ranks reported), and its world size among the candidate GPU counts. Of a mixture, the
    N and S of its dataset number `dataset` (a mixture has no splits of its own) and the
    mixture's G. `drop_last` starts unticked, the loader's default. None: `PLANNER_DEFAULTS`."""
    out = dict(PLANNER_DEFAULTS)
    if not placement:
        return out
    current = placement.get("current") or {}
    world = int(current.get("world_size") or 0)
    out["num_splits"] = int(placement["num_splits"])
    out["rows"] = max(out["num_splits"], out["num_splits"] * int(placement["rows_per_split"]))
    mixed = (placement.get("mixture") or {}).get("datasets") or []
    if mixed:
        chosen = mixed[min(max(dataset, 0), len(mixed) - 1)]
        out["num_splits"] = max(1, int(chosen["splits"]))
        out["rows"] = max(out["num_splits"], int(chosen.get("rows") or out["num_splits"]))
        out["dataset"] = chosen["name"]
    if current.get("global_batch_size"):
        out["global_batch"] = int(current["global_batch_size"])
    if world:
        gpus = sorted({int(g) for g in str(out["gpus"]).replace(",", " ").split()} | {world})
        out["gpus"] = ", ".join(str(g) for g in gpus)
    return out
