"""Who reads what: the one owner of split ownership, for the loader, the tools and the dashboard.

Two layouts, chosen by the global batch G (rows of all ranks in one step) and S:

- **Steps** (G a multiple of S, any W <= G): global step t is the next G rows of the
  all-splits stream (G/S of every split when the cursors are level), laid out split-major
  (split 0's rows, then split 1's, ...); rank r takes positions [r*G//W, (r+1)*G//W) of it.
  A rank owns whole splits plus fractions of the two at its edges; with W dividing S that
  is exactly the split layout below, same rows, same order.
- **Splits** (G not a multiple of S, or not known): W must divide S; rank r owns the
  contiguous splits [r*S/W, (r+1)*S/W) and streams them round-robin.

Standard library only, so light processes (the dashboard's collector and Streamlit app)
share these formulas with the loader without importing torch or Numba.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loader import args


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of each of the splits [split, split_stop) within one full global
    step (of G/S rows a split); a rank's share is at most three: a part, whole splits, a part."""

    split: int
    start: int
    stop: int
    split_stop: int = -1  # -1: just `split`

    def __post_init__(self) -> None:
        if self.split_stop == -1:
            object.__setattr__(self, "split_stop", self.split + 1)

    @property
    def splits(self) -> range:
        return range(self.split, self.split_stop)


def slice_bounds(rank: int, world_size: int, count: int) -> tuple[int, int]:
    """Positions [lo, hi) of a step's `count` rows that rank `rank` takes: sizes differ by
    at most one, and every rank gets a row when count >= world_size."""
    return rank * count // world_size, (rank + 1) * count // world_size


def uses_steps(num_splits: int, global_batch: int | None) -> bool:
    """Whether the step layout applies: a known global batch that is a multiple of S."""
    return global_batch is not None and global_batch % num_splits == 0


def supported_world_sizes(num_splits: int) -> list[int]:
    """World sizes that divide `num_splits` (the split layout's), ascending.

    Divisors come in pairs (w, S/w) with w <= sqrt(S): O(sqrt(S)) steps, so even S = 2**40
    answers in a fraction of a second.
    """
    num_splits = args.integer("num_splits", num_splits, 1)
    small = [w for w in range(1, math.isqrt(num_splits) + 1) if num_splits % w == 0]
    large = [num_splits // w for w in reversed(small) if w * w != num_splits]
    return small + large


def fit_reason(num_splits: int, world_size: int, global_batch: int | None = None) -> str:
    """Why W ranks cannot read S splits with global batch G; "" when they can."""
    if world_size < 1:
        return f"world_size must be >= 1, got {world_size}"
    if global_batch is not None and world_size > global_batch:
        return (
            f"world_size={world_size} is more than the global batch G={global_batch}: "
            f"every rank needs a row in every step"
        )
    if uses_steps(num_splits, global_batch):
        return ""
    if num_splits % world_size:
        multiple = "a global batch" if global_batch is None else f"G={global_batch}"
        return (
            f"num_splits={num_splits} is not divisible by world_size={world_size} and "
            f"{multiple} is not a multiple of num_splits; a global batch that is a multiple "
            f"of num_splits (e.g. global_batch_size={_multiple_at_least(num_splits, world_size)}) "
            f"lifts the limit: any world size up to G then works. Without one, "
            f"num_splits={num_splits} supports world sizes {_shown(num_splits)}"
        )
    if global_batch is not None and global_batch % world_size:
        return (
            f"global batch G={global_batch} is not a multiple of world_size={world_size} (and "
            f"not a multiple of num_splits={num_splits}, which would allow unequal per-rank "
            f"batches): pick G a multiple of num_splits"
        )
    return ""


def check_world_size(num_splits: int, world_size: int, global_batch: int | None = None) -> None:
    """Raise a ValueError saying why, and what works, when W cannot read this layout."""
    num_splits = args.integer("num_splits", num_splits, 1)
    world_size = args.integer("world_size", world_size, 1)
    global_batch = args.optional_integer("global_batch", global_batch, 1)
    reason = fit_reason(num_splits, world_size, global_batch)
    if reason:
        raise ValueError(reason)


def _check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {world_size - 1}]"
        )


def rank_pieces(
    rank: int, world_size: int, num_splits: int, global_batch: int | None = None
) -> list[Piece]:
    """What rank `rank` reads of every full global step, split by split (level cursors).

    In the split layout a rank's pieces are its whole splits, one row each per "step" of S
    rows; in the step layout they are its slice of the G/S rows of every split.
    """
    check_world_size(num_splits, world_size, global_batch)
    _check_rank(rank, world_size)
    if not uses_steps(num_splits, global_batch):
        per_rank = num_splits // world_size
        return [Piece(rank * per_rank, 0, 1, (rank + 1) * per_rank)]
    assert global_batch is not None
    per_split = global_batch // num_splits
    lo, hi = slice_bounds(rank, world_size, global_batch)
    first, last = lo // per_split, (hi - 1) // per_split  # the splits it touches
    if first == last:
        return [Piece(first, lo - first * per_split, hi - first * per_split)]
    pieces = []
    whole_from, whole_to = first, last + 1
    if lo > first * per_split:
        pieces.append(Piece(first, lo - first * per_split, per_split))
        whole_from = first + 1
    if hi < (last + 1) * per_split:
        whole_to = last
    if whole_from < whole_to:
        pieces.append(Piece(whole_from, 0, per_split, whole_to))
    if hi < (last + 1) * per_split:
        pieces.append(Piece(last, 0, hi - last * per_split))
    return pieces


def owned_splits(
    rank: int, world_size: int, num_splits: int, global_batch: int | None = None
) -> range:
    """The contiguous splits rank `rank` reads from (whole or in part)."""
    rank = args.integer("rank", rank, 0)
    pieces = rank_pieces(rank, world_size, num_splits, global_batch)
    return range(pieces[0].split, pieces[-1].split_stop)


def is_whole(piece: Piece, num_splits: int, global_batch: int | None) -> bool:
    """Whether a piece is its split's every row of a step (the split is not shared)."""
    per_split = 1
    if global_batch is not None and uses_steps(num_splits, global_batch):
        per_split = global_batch // num_splits
    return piece.start == 0 and piece.stop == per_split


def split_owners(
    world_size: int, num_splits: int, global_batch: int | None = None
) -> list[list[tuple[int, Piece]]]:
    """For every split, the ranks that read it and which part: O(S + W)."""
    owners: list[list[tuple[int, Piece]]] = [[] for _ in range(num_splits)]
    for rank in range(world_size):
        for piece in rank_pieces(rank, world_size, num_splits, global_batch):
            for split in piece.splits:
                owners[split].append((rank, Piece(split, piece.start, piece.stop)))
    return owners


def rank_shares(
    rank: int, world_size: int, num_splits: int, global_batch: int | None = None
) -> list[tuple[int, int]]:
    """For each split the rank reads (`owned_splits`, in order), its rows of the split's rows
    in a full global step, as (rows, of): rows == of for a split it reads whole. Its part of
    a split's cursor c is then c * rows // of (exact at whole steps): what the dashboard and
    the rank's telemetry count of a split it shares."""
    of = global_batch // num_splits if global_batch and uses_steps(num_splits, global_batch) else 1
    shares: list[tuple[int, int]] = []
    for piece in rank_pieces(rank, world_size, num_splits, global_batch):
        shares += [(piece.stop - piece.start, of)] * len(piece.splits)
    return shares


def rank_batch_sizes(world_size: int, global_batch: int) -> tuple[int, int]:
    """The smallest and largest per-rank batch of a full step of G rows on W ranks."""
    return global_batch // world_size, -(-global_batch // world_size)


def _multiple_at_least(num_splits: int, world_size: int) -> int:
    return num_splits * max(1, -(-world_size // num_splits))


def _shown(num_splits: int, limit: int = 24) -> str:
    sizes = supported_world_sizes(num_splits)
    text = ", ".join(map(str, sizes[:limit]))
    return f"[{text}{', …' if len(sizes) > limit else ''}]"
