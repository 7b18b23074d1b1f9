"""Who this process is in the job, and the one cross-rank agreement the loader makes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int = 0


def resolve_world(rank: int | None, world_size: int | None) -> World:
    """Explicit arguments, else torch.distributed when initialised, else RANK/WORLD_SIZE, else 0/1."""
    if dist.is_available() and dist.is_initialized():
        default_rank, default_size = dist.get_rank(), dist.get_world_size()
    else:
        default_rank = int(os.environ.get("RANK", "0"))
        default_size = int(os.environ.get("WORLD_SIZE", "1"))
    world = World(
        rank=default_rank if rank is None else rank,
        world_size=default_size if world_size is None else world_size,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )
    if world.world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world.world_size}")
    if not 0 <= world.rank < world.world_size:
        raise ValueError(
            f"Invalid rank {world.rank}, rank should be in the interval [0, {world.world_size - 1}]"
        )
    return world


def agree_with_rank0(value: Any) -> Any:
    """Rank 0's `value` on every rank (one broadcast) when torch.distributed is up.

    Used once at a fresh start for the table version, so a write landing while ranks start
    cannot hand two ranks two different tables.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
