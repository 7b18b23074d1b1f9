"""The epoch plan: which rows form split s in epoch e, and which splits rank r owns.

A pure function of (N, S, shuffle, seed, C, epoch): never of the world size, the workers
or the batch size, which is what makes global batches the same on 4, 8 or 12 GPUs. The
plan is a handful of integers and eight round keys; positions are computed on demand for
just the rows asked for (see `loader.kernels.permute`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader.kernels.permute import (
    _order_positions,
    _order_range,
    _passes_positions,
    _unpermute,
    half_bits_for,
    round_keys,
)
from loader.layout import check_world_size, owned_splits, supported_world_sizes
from loader.state import PlanIdentity

__all__ = [
    "EpochPlan",
    "PlanSpec",
    "ShuffleRequest",
    "check_world_size",
    "owned_splits",
    "supported_world_sizes",
]


@dataclass(frozen=True)
class ShuffleRequest:
    """How the user asked rows to be ordered: the plan's keywords that N and S do not fix."""

    shuffle: bool = True
    seed: int = 0
    clump_size: int = 1

    def with_seed(self, seed: int) -> ShuffleRequest:
        return ShuffleRequest(self.shuffle, seed, self.clump_size)


@dataclass(frozen=True)
class PlanSpec:
    """What identifies a plan for the life of a run (everything but the epoch)."""

    num_rows: int
    num_splits: int
    shuffle: bool = True
    shuffle_seed: int = 0
    clump_size: int = 1

    def __post_init__(self) -> None:
        if self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {self.num_splits}")
        if self.num_rows == 0:
            raise ValueError(
                "the source has no rows (after the filter): there is nothing to read; check "
                "that the table or path is the one meant, or widen the filter"
            )
        if self.num_rows < self.num_splits:
            raise ValueError(
                f"num_rows={self.num_rows} (after the filter) is smaller than "
                f"num_splits={self.num_splits}: every split needs at least one row; "
                f"lower num_splits to at most {self.num_rows} or widen the filter"
            )
        if self.clump_size < 1:
            raise ValueError(f"shuffle_clump_size must be >= 1, got {self.clump_size}")
        if self.shuffle_seed < 0:
            raise ValueError(f"shuffle_seed must be >= 0, got {self.shuffle_seed}")

    @classmethod
    def of(cls, num_rows: int, num_splits: int, request: ShuffleRequest) -> PlanSpec:
        return cls(num_rows, num_splits, request.shuffle, request.seed, request.clump_size)

    @property
    def request(self) -> ShuffleRequest:
        return ShuffleRequest(self.shuffle, self.shuffle_seed, self.clump_size)

    def identity(
        self, filter: str | None, drop_last: bool, packing: dict[str, Any] | None = None
    ) -> PlanIdentity:
        """The record a state stores and a resume compares (`loader.state.compare_plan`)."""
        return PlanIdentity(
            self.num_rows,
            self.num_splits,
            self.rows_per_split,
            self.shuffle,
            self.shuffle_seed,
            self.clump_size,
            filter,
            drop_last,
            tuple((packing or {}).items()),
        )

    @property
    def rows_per_split(self) -> int:
        """L = N // S."""
        return self.num_rows // self.num_splits

    @property
    def rows_dropped(self) -> int:
        """Rows of each epoch left out so that splits are equal (the shuffled tail)."""
        return self.num_rows - self.num_splits * self.rows_per_split

    def epoch(self, epoch: int) -> EpochPlan:
        return EpochPlan(self, epoch)


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's order, as the few numbers that let any slice of it be computed."""

    spec: PlanSpec
    epoch: int
    _keys: NDArray[np.uint64] = field(init=False, repr=False, compare=False)
    _layout: tuple[int, int, int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {self.epoch}")
        n = self.spec.num_rows
        # shuffle=False is one clump of everything: slot 0 holds clump 0, the identity.
        clump = self.spec.clump_size if self.spec.shuffle else n
        clump = min(clump, n)
        n_clumps = -(-n // clump)
        half = half_bits_for(n_clumps)
        keys = round_keys(self.spec.shuffle_seed, self.epoch, n, clump)
        short_len = n - (n_clumps - 1) * clump
        short_slot = int(_unpermute(n_clumps - 1, n_clumps, keys, half))
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_layout", (clump, n_clumps, short_slot, short_len, half))

    def order(self, order_idx: NDArray[np.int64]) -> NDArray[np.int64]:
        """Row positions at these indices of the epoch's order (a permutation of [0, N))."""
        clump, n_clumps, short_slot, short_len, half = self._layout
        idx = np.ascontiguousarray(order_idx, dtype=np.int64)
        return _order_positions(idx, clump, n_clumps, short_slot, short_len, self._keys, half)

    def order_of_passes(self, passes: int, order_idx: NDArray[np.int64]) -> NDArray[np.int64]:
        """`order(order_idx)` of this epoch and the `passes - 1` after it, end to end, in one
        kernel call (a mixture's small dataset repeating inside a step)."""
        clump, n_clumps, _, short_len, half = self._layout
        idx = np.ascontiguousarray(order_idx, dtype=np.int64)
        seed = np.uint64(self.spec.shuffle_seed)
        n = self.spec.num_rows
        return _passes_positions(idx, seed, self.epoch, passes, n, clump, n_clumps, short_len, half)

    def order_range(self, start: int, count: int) -> NDArray[np.int64]:
        """Positions order[start:start + count]: one int64 a row, nothing else."""
        clump, n_clumps, short_slot, short_len, half = self._layout
        return _order_range(start, count, clump, n_clumps, short_slot, short_len, self._keys, half)

    def split_rows(self, split: int, start: int = 0, stop: int | None = None) -> NDArray[np.int64]:
        """Positions of split[s][start:stop] (split s is order[s*L : (s+1)*L])."""
        length = self.spec.rows_per_split
        stop = length if stop is None else stop
        if not (0 <= split < self.spec.num_splits and 0 <= start <= stop <= length):
            raise IndexError(
                f"split {split} [{start}:{stop}] is outside S={self.spec.num_splits}, L={length}"
            )
        return self.order_range(split * length + start, stop - start)

    def rank_rows(self, rank: int, world_size: int) -> NDArray[np.int64]:
        """All positions of the splits a rank owns, split after split (for tools and benchmarks)."""
        splits = owned_splits(rank, world_size, self.spec.num_splits)
        length = self.spec.rows_per_split
        return self.order_range(splits.start * length, len(splits) * length)
