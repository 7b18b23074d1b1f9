"""Who this process is in the job, and the one cross-rank agreement the loader makes
(over which group, and never waiting for ever)."""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """A dataset's data-parallel place (rank, world_size) and, on a DeviceMesh, the process's
    own: its global rank and its coordinate on each mesh dim (plain data: it is pickled to
    workers with the dataset, the mesh is not)."""

    rank: int
    world_size: int
    local_rank: int = 0
    global_rank: int | None = None
    coordinates: tuple[tuple[str, int], ...] | None = None


class OnWorld:
    """What holds a `world` (a dataset, a mixture): its rank and world size, read from it."""

    world: World

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size

    @property
    def mesh_coordinates(self) -> dict[str, int] | None:
        """This process's coordinate on each mesh dim name (None when built without a mesh)."""
        coords = self.world.coordinates
        return None if coords is None else dict(coords)


SEED_PICKED = 2**63  # a picked seed lies in [0, 2**63): any JSON reader keeps it exact

# What the processes that build one dataset must agree on besides version and seed: named
# digests (the dataset's spec, and on a mesh its placement), compared field by field so a
# refusal names the field. The agreement identifies *which* dataset, never the order in
# which a process built its datasets.
Fields = tuple[tuple[str, int], ...]


def digest(value: Any) -> int:
    """A 63-bit digest of `value`'s repr (plain data: tuples, strings, ints, None)."""
    text = repr(value).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def first_difference(
    mine: list[int], theirs: list[list[int]], names: list[str]
) -> tuple[int, str] | None:
    """(index in `theirs`, field name) of the first that differs from `mine`, or None."""
    for i, other in enumerate(theirs):
        for name, a, b in zip(names, mine, other, strict=True):
            if a != b:
                return i, name
    return None


class Agreement(Protocol):
    """How the processes that build one dataset come to one table version and one seed."""

    def agree(
        self, version: int | None, version_given: bool, seed: int | None, fields: Fields = ()
    ) -> tuple[int | None, int]:
        """(version, seed) for every process: `version` is the one this process sees (or was
        given); `seed` None asks for one picked at random, the same everywhere; `fields`
        must be equal on every process (else ValueError on every one, naming the field)."""
        ...

    def gather(self, values: list[int], what: str) -> list[list[int]]:
        """Every `values` of the processes that build the dataset (a few int64s, the same
        count on each), the same table on each, in their order; only they take part.
        TimeoutError naming `what` when one never makes the same call."""
        ...

    def describe(self, index: int) -> str:
        """How an error names the process at `index` of `gather`'s table."""
        ...


@dataclass(frozen=True)
class GroupAgreement:
    """Rank 0 of `group` decides, by one broadcast; None: this process decides alone (and
    later calls are checked with nobody: a dataset built alone, or one whose processes the
    loader cannot know, as both pins were given for a place that is not the process's)."""

    group: Any | None

    def agree(
        self, version: int | None, version_given: bool, seed: int | None, fields: Fields = ()
    ) -> tuple[int | None, int]:
        mine = secrets.randbelow(SEED_PICKED) if seed is None else seed
        if self.group is None or (version_given and seed is not None):
            return version, mine
        if dist.get_world_size(self.group) == 1:
            return version, mine
        agreed_version, agreed_seed = _broadcast_pins(version, mine, self.group)
        check_alike(self, fields, "StreamingDataset")
        return (version if version_given else agreed_version), (
            mine if seed is not None else agreed_seed
        )

    def gather(self, values: list[int], what: str) -> list[list[int]]:
        return gather_from_ranks(values, self.group, what)

    def describe(self, index: int) -> str:
        group = self.group
        return f"rank {index if group is None else dist.get_global_rank(group, index)}"


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


def agreement_group(
    world: World, process_group: Any, version_given: bool, seed_given: bool
) -> Any | None:
    """The process group whose rank 0 decides the table version (and a picked seed) for a
    dataset of `world`, or None when this process decides alone.

    None (the default): torch.distributed's default group when the dataset's rank and world
    size are this process's in it, so every rank of the group builds it; a dataset one rank
    builds alone (rank=0, world_size=1, e.g. for evaluation) agrees with nobody. Any other
    place (a data-parallel rank on a tensor-parallel mesh) must say how it agrees, since
    the loader cannot know which processes build it: never one version or seed per group.
    A group: that group. False: nobody.
    """
    if process_group is False:
        return _alone(world, seed_given)
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
        _refuse_one_per_data_rank(world, process_group, version_given, seed_given)
        return process_group
    if not up or dist.get_world_size() == 1:
        return _alone(world, seed_given)
    if (world.rank, world.world_size) == (dist.get_rank(), dist.get_world_size()):
        return dist.group.WORLD
    if world.world_size == 1 or (version_given and seed_given):
        return _alone(world, seed_given)
    raise ValueError(
        f"StreamingDataset rank={world.rank}, world_size={world.world_size} is not this "
        f"process's place in torch.distributed (rank {dist.get_rank()} of "
        f"{dist.get_world_size()}), so the loader cannot tell which processes build it and "
        f"agree with them on one table version and seed. {_HOW_TO_AGREE}"
    )


_HOW_TO_AGREE = (
    "Pass mesh=<DeviceMesh> (data split over its data-parallel dims, agreed over every "
    "process of the mesh), or process_group=<every process that reads this data: all "
    "processes for tensor or context parallel, the reading stages for pipeline parallel>, "
    "or pin both yourself: version=<int> and shuffle_seed=<int>, the same on every process"
)


def _alone(world: World, seed_given: bool) -> Any | None:
    """No group: fine for one rank, or when every rank was given the same seed."""
    if world.world_size > 1 and not seed_given:
        raise ValueError(
            "shuffle_seed=None picks a seed on rank 0 and shares it through "
            "torch.distributed, but no process group covers this dataset's ranks here "
            "(torch.distributed not initialised, rank/world_size not the process's, or "
            "process_group=False); pass shuffle_seed=<int> (the same on every rank), call "
            "init_process_group first, pass process_group=<the group of its ranks>, or mesh="
        )
    return None


def _refuse_one_per_data_rank(
    world: World, group: Any, version_given: bool, seed_given: bool
) -> None:
    """A group of at most one process per data rank, in a job with more processes, leaves
    out processes that read the same data (the other tensor-parallel peers): agreeing over
    it would give each such group its own version or seed. Every process of the job sees the
    same sizes, so every one refuses alike."""
    size, job = dist.get_world_size(group), dist.get_world_size()
    if world.world_size == 1 or size > world.world_size or size == job:
        return
    if version_given and seed_given:
        return
    missing = "shuffle_seed=None" if not seed_given else "version=None"
    raise ValueError(
        f"{missing} agreed over a process_group of {size} processes for a dataset of "
        f"world_size={world.world_size}, in a job of {job} processes: the processes left out "
        "(e.g. tensor-parallel peers of the same data-parallel rank) would agree on their own "
        "seed and table version and read other rows. Pass shuffle_seed=<int> and "
        "version=<int> (the same on every process), or mesh=<DeviceMesh>, or a process_group "
        "of every process that reads this data"
    )


def _broadcast_pins(version: int | None, seed: int, group: Any) -> tuple[int | None, int]:
    """Rank 0's (version, seed) on every rank of `group`: one broadcast, AGREE_TIMEOUT_S at
    most. Used once at a fresh start, so a write landing while ranks start cannot hand two
    ranks two different tables."""
    if version is not None and not -_INT64 <= version < _INT64:
        raise ValueError(f"version={version} does not fit the int64 it is broadcast in")
    box = torch.tensor([version is None, version or 0, seed], dtype=torch.int64)
    box = box.to(_device(group))
    src = dist.get_global_rank(group, 0)
    _bounded_wait(
        dist.broadcast(box, src, group=group, async_op=True),
        lambda limit_s, err: (
            f"StreamingDataset on rank {dist.get_rank()}: the ranks of its process group did "
            f"not agree on the table version within {limit_s:g} s ({err}; "
            f"${ENV_AGREE_TIMEOUT} sets the limit, for ranks that legitimately start far "
            "apart). Every rank of the group must build this dataset. A dataset that one rank "
            "builds alone (e.g. for evaluation) needs rank=0, world_size=1 (or "
            "process_group=False); for a subset of ranks pass process_group=<their group>; "
            "or pin it yourself: version=<int> (and shuffle_seed=<int>)"
        ),
    )
    is_none, agreed, agreed_seed = box.tolist()
    return (None if is_none else int(agreed)), int(agreed_seed)


def check_alike(agreement: Agreement, fields: Fields, what: str) -> None:
    """ValueError on every process that builds the dataset when their `fields` differ,
    naming the first process that differs and the field (a call they all make alike: the
    dataset itself, a loader over it, set_weights)."""
    if not fields:
        return
    rows = agreement.gather([value for _, value in fields], what)
    found = first_difference(rows[0], rows[1:], [name for name, _ in fields])
    if found is not None:
        index, name = found
        raise ValueError(
            f"{what}: the processes that build the dataset differ on {name}: "
            f"{agreement.describe(index + 1)} is the first that passed another {name} than "
            f"{agreement.describe(0)}. {SAME_DATASETS}"
        )


SAME_DATASETS = (
    "Every process must build the same datasets, in the same order, with the same arguments "
    "(a process that built another dataset first pairs it with this one)"
)


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
