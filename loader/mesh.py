"""Where a dataset stands: its data-parallel rank and world size, and who agrees on its
table version and seed.

On a `DeviceMesh` the data-parallel dims (dp, dp_replicate, dp_shard, batch, data) split
the data and every other dim (tp, cp, ep, pp) replicates it: the dataset's rank is the
process's flattened coordinate over the data-parallel dims. The version and seed are then
agreed over every process of the mesh that builds the dataset, by point-to-point messages to
the first of them (not a collective), so that the one that decides can name a process that
never came, and every process can name one that sent something else.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from loader import args
from loader.world import (
    ENV_AGREE_TIMEOUT,
    SAME_DATASETS,
    SEED_PICKED,
    Agreement,
    Fields,
    GroupAgreement,
    World,
    agree_timeout_s,
    agreement_group,
    digest,
    resolve_world,
)

DP_DIM_NAMES = ("dp", "dp_replicate", "dp_shard", "batch", "data")
_TAG = 0x454C  # the agreement's point-to-point messages ("EL")
_LISTED = 8  # processes a reply names at most
# A process's pins: version is None, version, version given, seed given, seed, then one
# digest per field (the dataset's spec, then the placement: MeshGrid.fields).
# The reply: status, version is None, version, seed, how many named, the field that
# differs, the named.
_OK, _MISSING, _VERSIONS, _SEEDS, _FIELD = 0, 1, 2, 3, 4
_PINS, _HEAD = 5, 6


@dataclass(frozen=True)
class Placement:
    """A dataset's world and how its processes agree."""

    world: World
    agreement: Agreement


def place(
    rank: int | None,
    world_size: int | None,
    mesh: Any,
    dp_dims: Sequence[str] | None,
    read_on: Mapping[str, Sequence[int]] | None,
    process_group: Any,
    version_given: bool,
    seed_given: bool,
) -> Placement:
    """The dataset's place: from `mesh` when given, else from rank/world_size (or
    torch.distributed, or the environment), agreed over `process_group` (world.py's rules)."""
    if mesh is None:
        if dp_dims is not None or read_on is not None:
            name = "dp_dims" if dp_dims is not None else "read_on"
            raise ValueError(f"{name}= names dims of a DeviceMesh: pass mesh=<DeviceMesh> too")
        world = resolve_world(
            args.optional_integer("rank", rank, 0),
            args.optional_integer("world_size", world_size, 1),
        )
        group = agreement_group(world, process_group, version_given, seed_given)
        return Placement(world, GroupAgreement(group))
    if process_group is not None:
        raise ValueError(
            "pass mesh= or process_group=, not both: with a mesh the version and seed are "
            "agreed over every process of the mesh that builds the dataset"
        )
    grid = MeshGrid.of(mesh, dp_dims, read_on)
    _refuse_a_slice(grid, version_given and seed_given)
    world = grid.world()
    for name, given, mine in (
        ("rank", rank, world.rank),
        ("world_size", world_size, world.world_size),
    ):
        if given is not None and given != mine:
            raise ValueError(
                f"{name}={given} contradicts mesh=: this process is data-parallel rank "
                f"{world.rank} of {world.world_size} over dims {grid.dp_dims}; leave {name} out "
                "(the mesh gives it) or pass the mesh's value"
            )
    return Placement(world, MeshAgreement(grid))


def _refuse_a_slice(grid: MeshGrid, pinned: bool) -> None:
    """A mesh of data-parallel dims only, over fewer processes than the job, is most often a
    slice (`world_mesh["dp"]`): the processes of the other slices, its tensor-parallel
    peers, would agree on their own version and seed. Every slice refuses alike."""
    job = dist.get_world_size()
    if pinned or set(grid.dp_dims) != set(grid.names) or grid.ranks.numel() == job:
        return
    raise ValueError(
        f"mesh= has only data-parallel dims {grid.names} and {grid.ranks.numel()} of the job's "
        f'{job} processes: if it is a slice such as world_mesh["dp"], the processes of the '
        "other slices (tensor- or context-parallel peers) would agree on another version and "
        "seed. Pass the whole mesh (mesh=world_mesh; dp_dims= names its data-parallel dims), "
        "or pin both: version=<int> and shuffle_seed=<int>, the same on every process"
    )


@dataclass(frozen=True)
class MeshGrid:
    """The mesh as plain data: dim names and sizes, the global rank at every coordinate,
    which dims split the data, and which processes build the dataset (`read_on`)."""

    names: tuple[str, ...]
    ranks: torch.Tensor  # (size of dim 0, size of dim 1, ...) global ranks
    dp_dims: tuple[str, ...]
    readers: tuple[int, ...]  # global ranks that build the dataset, in mesh order
    me: int  # this process's global rank

    @classmethod
    def of(
        cls, mesh: Any, dp_dims: Sequence[str] | None, read_on: Mapping[str, Sequence[int]] | None
    ) -> MeshGrid:
        if not isinstance(mesh, DeviceMesh):
            raise ValueError(f"mesh={mesh!r}: expected a torch.distributed DeviceMesh")
        names = mesh.mesh_dim_names
        if not names:
            raise ValueError(
                "mesh= has no dim names; build it with mesh_dim_names, e.g. "
                'init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))'
            )
        if mesh.get_coordinate() is None:
            raise ValueError(
                f"mesh=: this process (global rank {dist.get_rank()}) is not in the mesh; "
                "build the dataset on the mesh's processes only"
            )
        chosen = _dp_dims(tuple(names), dp_dims)
        ranks = mesh.mesh.to("cpu")
        grid = cls(tuple(names), ranks, chosen, (), dist.get_rank())
        readers = grid.readers_of(read_on)
        if grid.me not in readers:
            raise ValueError(
                f"read_on={dict(read_on or {})}: this process, {grid.describe(grid.me)}, is not "
                "one of the processes that read; build the dataset only where the data is used "
                "(e.g. the first and last pipeline stages)"
            )
        return cls(tuple(names), ranks, chosen, readers, grid.me)

    def coordinate(self, global_rank: int) -> tuple[int, ...]:
        found = (self.ranks == global_rank).nonzero()
        return tuple(int(c) for c in found[0].tolist())

    def describe(self, global_rank: int) -> str:
        """'global rank 3 (dp=1, tp=1)': how an error names a process."""
        coords = ", ".join(
            f"{n}={c}" for n, c in zip(self.names, self.coordinate(global_rank), strict=True)
        )
        return f"global rank {global_rank} ({coords})"

    def readers_of(self, read_on: Mapping[str, Sequence[int]] | None) -> tuple[int, ...]:
        """The global ranks whose coordinate on each dim of `read_on` is one it lists."""
        if read_on is None:
            return tuple(int(r) for r in self.ranks.flatten().tolist())
        if not isinstance(read_on, Mapping) or not read_on:
            raise ValueError(
                f"read_on={read_on!r}: expected a dict of mesh dim name -> coordinates that "
                'build the dataset, e.g. {"pp": [0, 3]} for the first and last of 4 stages'
            )
        keep = torch.ones(self.ranks.shape, dtype=torch.bool)
        for name, coords in read_on.items():
            if name not in self.names or name in self.dp_dims:
                raise ValueError(
                    f"read_on={dict(read_on)}: {name!r} is not a replicating dim of the mesh "
                    f"(dims {self.names}, data-parallel {self.dp_dims})"
                )
            size = self.ranks.shape[self.names.index(name)]
            wanted = [args.integer(f"read_on[{name!r}]", c, 0, size) for c in coords]
            if not wanted:
                raise ValueError(f"read_on[{name!r}] is empty: name the coordinates that read")
            along = torch.zeros(size, dtype=torch.bool)
            along[wanted] = True
            shape = [1] * self.ranks.dim()
            shape[self.names.index(name)] = size
            keep &= along.view(shape)
        return tuple(int(r) for r in self.ranks[keep].tolist())

    def fields(self) -> Fields:
        """The placement every reader must share, as named digests."""
        return (
            ("mesh shape", digest((tuple(self.ranks.shape), self.ranks.flatten().tolist()))),
            ("mesh dim names", digest(self.names)),
            ("dp_dims", digest(self.dp_dims)),
            ("read_on", digest(self.readers)),
        )

    def world(self) -> World:
        coords = self.coordinate(self.me)
        rank, size = 0, 1
        for name in self.dp_dims:  # row-major over the data-parallel dims, in mesh order
            dim = self.names.index(name)
            rank = rank * self.ranks.shape[dim] + coords[dim]
            size *= self.ranks.shape[dim]
        return World(
            rank,
            size,
            local_rank=resolve_world(None, None).local_rank,
            global_rank=self.me,
            coordinates=tuple(zip(self.names, coords, strict=True)),
        )


def _dp_dims(names: tuple[str, ...], dp_dims: Sequence[str] | None) -> tuple[str, ...]:
    if dp_dims is None:
        found = tuple(n for n in names if n in DP_DIM_NAMES)
        if not found:
            raise ValueError(
                f"mesh= has dims {names} and none of the data-parallel names {DP_DIM_NAMES}; "
                'name them: dp_dims=("dp",)'
            )
        return found
    if isinstance(dp_dims, str) or not all(isinstance(n, str) for n in dp_dims):
        raise ValueError(f'dp_dims={dp_dims!r}: expected a tuple of mesh dim names, e.g. ("dp",)')
    unknown = [n for n in dp_dims if n not in names]
    if unknown or len(set(dp_dims)) != len(dp_dims):
        raise ValueError(f"dp_dims={tuple(dp_dims)}: expected distinct dims of the mesh {names}")
    return tuple(n for n in names if n in dp_dims)  # mesh order: the flattening's order


@dataclass(frozen=True)
class MeshAgreement:
    """The first reader decides: every other reader sends it what it sees and was given, it
    answers with the version and seed, or with the processes that never came or differ."""

    grid: MeshGrid

    def agree(
        self, version: int | None, version_given: bool, seed: int | None, fields: Fields = ()
    ) -> tuple[int | None, int]:
        pins = [version is None, version or 0, version_given, seed is not None, seed or 0]
        if seed is None:
            pins[4] = secrets.randbelow(SEED_PICKED)
        named = (*fields, *self.grid.fields())
        mine = torch.tensor(pins + [value for _, value in named], dtype=torch.int64)
        if len(self.grid.readers) == 1:
            return version, int(pins[4])
        limit_s = agree_timeout_s()
        if self.grid.me == self.grid.readers[0]:
            reply = self._decide(mine, limit_s)
        else:
            reply = self._ask(mine, limit_s)
        return self._verdict(reply, limit_s, version, version_given, seed, named)

    def _decide(self, mine: torch.Tensor, limit_s: float) -> torch.Tensor:
        others = self.grid.readers[1:]
        boxes = torch.zeros((len(others), mine.numel()), dtype=torch.int64)
        works = [dist.irecv(boxes[i], src=r, tag=_TAG) for i, r in enumerate(others)]
        deadline = time.monotonic() + limit_s
        came = _all_arrived(works, deadline)
        missing = [r for r, ok in zip(others, came, strict=True) if not ok]
        reply = torch.zeros(_HEAD + _LISTED, dtype=torch.int64)
        reply[1:4] = mine[[0, 1, 4]]
        status, named = _MISSING, missing
        if not missing:
            status, named = _OK, []
            for i, r in enumerate(others):  # the first process that differs, and its field
                differs = (boxes[i, _PINS:] != mine[_PINS:]).nonzero()
                if differs.numel():
                    status, named = _FIELD, [r]
                    reply[5] = int(differs[0, 0])
                    break
        if status == _OK:
            versions = [r for i, r in enumerate(others) if _differs(boxes[i], mine, (2, 1))]
            seeds = [r for i, r in enumerate(others) if _differs(boxes[i], mine, (3, 4))]
            status, named = (_VERSIONS, versions) if versions else (_SEEDS, seeds)
            status = status if named else _OK
        reply[0], reply[4] = status, len(named)
        listed = named[:_LISTED]
        reply[_HEAD : _HEAD + len(listed)] = torch.tensor(listed, dtype=torch.int64)
        sends = [
            dist.isend(reply, dst=r, tag=_TAG) for r, ok in zip(others, came, strict=True) if ok
        ]
        _all_arrived(sends, time.monotonic() + limit_s)
        return reply

    def gather(self, values: list[int], what: str) -> list[list[int]]:
        """Every reader's `values`, in reader order: the first reader gathers them and sends
        each reader the whole table (point to point, among the readers only)."""
        readers = self.grid.readers
        if len(readers) == 1:
            return [list(values)]
        mine = torch.tensor(values, dtype=torch.int64)
        table = torch.zeros((len(readers), mine.numel()), dtype=torch.int64)
        limit_s = agree_timeout_s()
        origin, tag = readers[0], _TAG + 1
        if self.grid.me == origin:
            table[0] = mine
            works = [dist.irecv(table[i], src=r, tag=tag) for i, r in enumerate(readers) if i]
            came = _all_arrived(works, time.monotonic() + limit_s)
            missing = [r for r, ok in zip(readers[1:], came, strict=True) if not ok]
            if missing:
                raise TimeoutError(self._never_came(missing, what, limit_s))
            sends = [dist.isend(table, dst=r, tag=tag) for r in readers[1:]]
            _all_arrived(sends, time.monotonic() + limit_s)
        else:
            send = dist.isend(mine, dst=origin, tag=tag)
            answer = dist.irecv(table, src=origin, tag=tag)
            if not _arrived(answer, time.monotonic() + 2 * limit_s):
                raise TimeoutError(self._never_came([origin], what, 2 * limit_s))
            _arrived(send, time.monotonic() + limit_s)
        return [[int(x) for x in row] for row in table.tolist()]

    def describe(self, index: int) -> str:
        return self.grid.describe(self.grid.readers[index])

    def _never_came(self, missing: list[int], what: str, limit_s: float) -> str:
        named = ", ".join(self.grid.describe(r) for r in missing[:_LISTED])
        return (
            f"{what} on {self.grid.describe(self.grid.me)}: {named} did not make the same call "
            f"within {limit_s:g} s (${ENV_AGREE_TIMEOUT} sets the limit); every process that "
            "builds the dataset must make it, and only those"
        )

    def _ask(self, mine: torch.Tensor, limit_s: float) -> torch.Tensor:
        origin = self.grid.readers[0]
        send = dist.isend(mine, dst=origin, tag=_TAG)
        reply = torch.zeros(_HEAD + _LISTED, dtype=torch.int64)
        answer = dist.irecv(reply, src=origin, tag=_TAG)
        if not _arrived(answer, time.monotonic() + 2 * limit_s):  # it waits limit_s itself
            raise TimeoutError(
                f"StreamingDataset on {self.grid.describe(self.grid.me)}: "
                f"{self.grid.describe(origin)}, which decides the table version and seed for "
                f"the mesh, did not answer within {2 * limit_s:g} s: it did not build this "
                f"dataset, or is stuck. {_EVERY_PROCESS}"
            )
        _arrived(send, time.monotonic() + limit_s)
        return reply

    def _verdict(
        self,
        reply: torch.Tensor,
        limit_s: float,
        version: int | None,
        version_given: bool,
        seed: int | None,
        fields: Fields,
    ) -> tuple[int | None, int]:
        status, version_none, agreed, agreed_seed, count, field = (
            int(x) for x in reply[:_HEAD].tolist()
        )
        listed = reply[_HEAD : _HEAD + min(count, _LISTED)]
        named = ", ".join(self.grid.describe(int(r)) for r in listed)
        more = f" and {count - _LISTED} more" if count > _LISTED else ""
        where = f"StreamingDataset on {self.grid.describe(self.grid.me)}"
        origin = self.grid.describe(self.grid.readers[0])
        if status == _MISSING:
            raise TimeoutError(
                f"{where}: {named}{more} did not build this dataset within {limit_s:g} s "
                f"(${ENV_AGREE_TIMEOUT} sets the limit). {_EVERY_PROCESS}"
            )
        if status == _FIELD:
            name = fields[field][0]
            raise ValueError(
                f"{where}: the processes of the mesh that build this dataset differ on {name}: "
                f"{named} is the first that passed another {name} than {origin}. "
                f"{SAME_DATASETS}"
            )
        if status == _VERSIONS:
            raise ValueError(
                f"{where}: version= differs across the mesh: {named}{more} passed another "
                f"version= than {origin}; pass the same version on every process, or none"
            )
        if status == _SEEDS:
            raise ValueError(
                f"{where}: shuffle_seed differs across the mesh: {named}{more} passed another "
                f"than {origin}; pass the same shuffle_seed=<int> on every process (or None "
                "on every process for one picked at random)"
            )
        if version_given:
            return version, seed if seed is not None else agreed_seed
        return (None if version_none else agreed), agreed_seed


_EVERY_PROCESS = (
    "Every process of mesh= builds the dataset (processes that do not need data, e.g. middle "
    'pipeline stages, are left out with read_on={"pp": [first, last]} on the ones that do)'
)


def _arrived(work: Any, deadline: float) -> bool:
    """Whether `work` completed by `deadline`."""
    return _all_arrived([work], deadline)[0]


def _all_arrived(works: Sequence[Any], deadline: float) -> list[bool]:
    """Which of `works` completed by `deadline`. Each is waited on in a thread of its own:
    Gloo's point-to-point work cannot be polled (`is_completed` turns true only in `wait`),
    and its `wait(timeout=)` closes every connection when it times out, while the
    processes that did come must still be told which one did not."""
    done = [threading.Event() for _ in works]

    def wait(i: int) -> None:
        with contextlib.suppress(RuntimeError):  # a failed message is one that did not come
            works[i].wait()
            done[i].set()

    for i in range(len(works)):
        threading.Thread(target=wait, args=(i,), daemon=True, name="loader-agree").start()
    for event in done:
        event.wait(max(0.0, deadline - time.monotonic()))
    return [event.is_set() for event in done]


def _differs(theirs: torch.Tensor, mine: torch.Tensor, fields: tuple[int, int]) -> bool:
    """Whether a process gave another (flag, value): both give, or neither, the same value."""
    flag, value = fields
    if int(theirs[flag]) != int(mine[flag]):
        return True
    return bool(mine[flag]) and int(theirs[value]) != int(mine[value])
