"""What a StreamingDataset is asked to read, checked once, and how it meets a source and a plan.

The constructor keeps the keyword names of `lancedb.streaming.StreamingDataset`; here they
are checked (each error names the argument) and grouped into one frozen `DatasetRequest`,
and the steps from a table handle to a pinned source and its plan are pure functions of it.
Kept apart from the dataset class so those rules read without the iteration and state code.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loader import args
from loader import state as st
from loader.cache import CacheSpec
from loader.packing import pack_spec, packed_clump
from loader.plan import PlanSpec, ShuffleRequest
from loader.read.reader import ON_ERROR, OnError
from loader.sources import ResolvedSource, resolve_source
from loader.units import UnitRequest
from loader.world import Fields, World, digest

CLUMP_FROM_N = 0  # a packed dataset's clump when none is given: `packed_clump(N)`


@dataclass(frozen=True)
class SourceRequest:
    """What to read of the source: its columns and rows, and how to reach and cache it."""

    columns: list[str] | None
    filter: Any
    storage_options: dict[str, str] | None
    cache: CacheSpec | None

    def resolve(self, raw_source: Any, version: int | None) -> ResolvedSource:
        """The source at `version` (None: the latest), opened as asked."""
        if raw_source is None:
            raise RuntimeError(
                "this StreamingDataset is a pickled copy (e.g. inside a DataLoader worker) and "
                "cannot reopen its source; load states into the original in the main process"
            )
        return resolve_source(
            raw_source,
            version=version,
            columns=self.columns,
            filter=self.filter,
            storage_options=self.storage_options,
            cache=self.cache,
        )


@dataclass(frozen=True)
class DatasetRequest:
    """The constructor's arguments but the source handle and the placement, checked."""

    source: SourceRequest
    num_splits: int
    units: UnitRequest
    shuffle: ShuffleRequest  # seed 0 until the processes agree on one
    seed_picked: bool  # shuffle_seed=None: a loaded state's seed is adopted
    start_epoch: int
    allow_source_change: bool

    @classmethod
    def check(
        cls,
        world: World,
        *,
        columns: list[str] | None,
        filter: Any,
        num_splits: int | None,
        shuffle: bool,
        shuffle_seed: int | None,
        shuffle_clump_size: int | None,
        epoch: int,
        transform: Callable[[dict[str, Any]], Any] | None,
        on_error: OnError,
        allow_source_change: bool,
        storage_options: dict[str, str] | None,
        pack_sequences: int | None,
        eos_id: int | None,
        pad_id: int | None,
        blocks_per_epoch: int | None,
        pack_fields: list[str] | tuple[str, ...] | None,
        pack_dtype: Any,
        cache_dir: str | os.PathLike[str] | None,
        cache_limit: int | str | None,
    ) -> DatasetRequest:
        """Check the arguments (see `StreamingDataset`), in the order the constructor did."""
        splits = _splits_or_default(num_splits, world)
        columns = args.columns(columns)
        source = SourceRequest(
            columns, filter, storage_options, CacheSpec.of(cache_dir, cache_limit)
        )
        allow_change = args.boolean("allow_source_change", allow_source_change)
        pack = pack_spec(
            pack_sequences,
            eos_id,
            pad_id,
            blocks_per_epoch,
            columns,
            splits,
            pack_fields,
            pack_dtype,
        )
        units = UnitRequest(
            pack,
            args.callable_or_none("transform", transform),
            args.one_of("on_error", on_error, ON_ERROR),
        )
        if units.pack is not None and transform is not None:
            raise ValueError("transform (per row) cannot be combined with pack_sequences")
        order = ShuffleRequest(
            args.boolean("shuffle", shuffle),
            shuffle_seed or 0,  # the agreed seed replaces it
            args.optional_integer("shuffle_clump_size", shuffle_clump_size, 1)
            or (CLUMP_FROM_N if units.pack is not None else 1),
        )
        start_epoch = args.integer("epoch", epoch, 0)
        return cls(source, splits, units, order, shuffle_seed is None, start_epoch, allow_change)


def _splits_or_default(num_splits: int | None, world: World) -> int:
    splits = args.optional_integer("num_splits", num_splits, 1)
    if splits is not None:
        return splits
    warnings.warn(
        f"num_splits not set: using world_size={world.world_size}. A resume on another "
        f"number of GPUs needs the same num_splits; set it explicitly (e.g. num_splits=48)",
        stacklevel=4,  # the user's StreamingDataset(...) call
    )
    return world.world_size


def plan_on(
    resolved: ResolvedSource, order: ShuffleRequest, num_splits: int, seed: int | None = None
) -> PlanSpec:
    """The plan of `order` (with `seed`, when given) on the resolved source's row count."""
    request = order if seed is None else order.with_seed(seed)
    if request.clump_size == CLUMP_FROM_N:  # packed, none given: fixed by the first N
        request = dataclasses.replace(request, clump_size=packed_clump(resolved.num_rows))
    return PlanSpec.of(resolved.num_rows, num_splits, request)


def spec_fields(
    asked: DatasetRequest,
    order: ShuffleRequest,
    resolved: ResolvedSource,
    version: int | None,
    seed: int | None,
) -> Fields:
    """Which dataset this is, as named digests the processes that build it compare."""
    spec = resolved.spec
    return (
        ("source", digest((spec.kind, spec.uri, spec.table, version))),
        ("columns", digest(asked.source.columns)),
        ("filter", digest(resolved.filter)),
        ("num_splits", digest(asked.num_splits)),
        ("shuffle", digest((order.shuffle, order.clump_size))),
        ("shuffle_seed", digest(seed)),
        ("units", digest(sorted(asked.units.identity().items()))),
    )


def saved_seed(state: dict[str, Any]) -> int:
    """The shuffle seed a loaded state was saved with, checked (adopted by `shuffle_seed=None`)."""
    seed = state[st.KEY_PLAN].get(st.PLAN_SHUFFLE_SEED)
    try:
        return args.integer("plan.shuffle_seed", seed, 0, args.SEED_LIMIT)
    except (TypeError, ValueError) as err:
        raise ValueError(f"loader state: {err}") from None
