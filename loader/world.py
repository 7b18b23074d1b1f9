"""Who this process is in the job, and the one cross-rank agreement the loader makes
(over which group, and never waiting for ever)."""

from __future__ import annotations

import datetime
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    world_size: int
    local_rank: int = 0


class OnWorld:
    """What holds a `world` (a dataset, a mixture): its rank and world size, read from it."""

    world: World

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size


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


AGREE_TIMEOUT_S = 300.0  # the longest a rank waits for the others to agree, by default
ENV_AGREE_TIMEOUT = "ELASTIC_LOADER_AGREE_TIMEOUT_S"  # ... or as this variable says
_INT64 = 2**63


def agreement_group(world: World, process_group: Any, version_pinned: bool) -> Any | None:
    """The process group whose rank 0 decides the table version (and a picked seed) for a
    dataset of `world`, or None when this process decides alone.

    None (the default): torch.distributed's default group, but only when the dataset's rank
    and world size are this process's in it, so every rank of the group builds it; a
    dataset one rank builds alone (rank=0, world_size=1, e.g. for evaluation) agrees with
    nobody, instead of waiting forever in a collective the others never join. A group:
    that group. False: nobody.
    """
    if process_group is False:
        return None
    up = dist.is_available() and dist.is_initialized()
    if process_group is not None:
        if not up or not isinstance(process_group, dist.ProcessGroup):
            raise ValueError(
                f"process_group={process_group!r}: expected a torch.distributed ProcessGroup "
                "(torch.distributed initialised), None (the default group when this dataset's "
                "rank and world_size are the process's) or False (no agreement)"
            )
        if dist.get_rank(process_group) < 0:
            raise ValueError(
                f"process_group: rank {dist.get_rank()} is not a member of the group it was "
                "given; pass the group of the ranks that build this dataset, on those ranks"
            )
        return process_group
    if not up or dist.get_world_size() == 1:
        return None
    if (world.rank, world.world_size) != (dist.get_rank(), dist.get_world_size()):
        if world.world_size > 1 and not version_pinned:
            warnings.warn(
                f"StreamingDataset rank={world.rank}, world_size={world.world_size} is not this "
                f"process's place in torch.distributed (rank {dist.get_rank()} of "
                f"{dist.get_world_size()}), so its ranks do not agree on the table version; "
                "pass process_group=<the group of its ranks> or version=<int>",
                stacklevel=3,
            )
        return None
    return dist.group.WORLD


def agree_with_rank0(value: int | None, group: Any | None, what: str) -> int | None:
    """Rank 0's `value` (an int64 or None) on every rank of `group` (one broadcast); `value`
    itself when `group` is None or has one rank. Waits AGREE_TIMEOUT_S at most.

    Used once at a fresh start for the table version, so a write landing while ranks start
    cannot hand two ranks two different tables; and for a picked shuffle seed.
    """
    if group is None or dist.get_world_size(group) == 1:
        return value
    if value is not None and not -_INT64 <= value < _INT64:
        raise ValueError(f"{what}={value} does not fit the int64 it is broadcast in")
    box = torch.tensor([value is None, value or 0], dtype=torch.int64, device=_device(group))
    src = dist.get_global_rank(group, 0)
    _bounded_wait(
        dist.broadcast(box, src, group=group, async_op=True),
        lambda limit_s, err: (
            f"StreamingDataset on rank {dist.get_rank()}: the ranks of its process group did "
            f"not agree on the {what} within {limit_s:g} s ({err}; ${ENV_AGREE_TIMEOUT} sets "
            "the limit, for ranks that legitimately start far apart). Every rank "
            "of the group must build this dataset. A dataset that one rank builds alone "
            "(e.g. for evaluation) needs rank=0, world_size=1 (or process_group=False); for a "
            "subset of ranks pass process_group=<their group>; or pin it yourself: "
            "version=<int> (and shuffle_seed=<int>)"
        ),
    )
    is_none, agreed = box.tolist()
    return None if is_none else int(agreed)


def gather_from_ranks(values: list[int], group: Any | None, what: str) -> list[list[int]]:
    """Every rank's `values` (a few int64s, the same count on each), in rank order, by one
    all_gather over `group`; [values] when `group` is None or has one rank. Waits
    agree_timeout_s() at most, then TimeoutError naming `what`: a rank that never makes the
    same call is an error within a bounded wait, not a hang."""
    if group is None or dist.get_world_size(group) == 1:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.int64, device=_device(group))
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    _bounded_wait(
        dist.all_gather(out, mine, group=group, async_op=True),
        lambda limit_s, err: (
            f"rank {dist.get_rank()}: the other ranks did not make the same {what} call within "
            f"{limit_s:g} s ({err}); every rank must call it, with the same arguments "
            f"(${ENV_AGREE_TIMEOUT} sets the limit)"
        ),
    )
    return [t.tolist() for t in out]


def _bounded_wait(work: Any, message: Callable[[float, RuntimeError], str]) -> None:
    """Wait for a collective's `work` agree_timeout_s() at most, else TimeoutError(message)."""
    limit_s = agree_timeout_s()
    try:
        work.wait(timeout=datetime.timedelta(seconds=limit_s))
    except RuntimeError as err:
        raise TimeoutError(message(limit_s, err)) from err


def agree_timeout_s() -> float:
    """AGREE_TIMEOUT_S, or the positive number of seconds $ELASTIC_LOADER_AGREE_TIMEOUT_S says."""
    said = os.environ.get(ENV_AGREE_TIMEOUT)
    if not said:
        return AGREE_TIMEOUT_S
    try:
        seconds = float(said)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"${ENV_AGREE_TIMEOUT}={said!r}: expected a positive number of seconds")
    return seconds


def _device(group: Any) -> torch.device:
    """Where the broadcast tensor lives: the CPU, unless the group is NCCL-only."""
    backend = str(dist.get_backend(group))
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
