"""StreamingDataset: one rank's rows of a pinned table, in the elastic order.

Keeps the keyword names of `lancedb.streaming.StreamingDataset`, so switching is one
import. It owns the plan, the pinned source and one `Progress` (the position: epoch,
cursors, step); `StreamingDataLoader` batches it. Iterating the dataset directly yields rows.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from loader import args
from loader import state as st
from loader.layout import check_world_size, owned_splits
from loader.packing import (
    PACK_FIELDS,
    PACKED_CLUMP,
    PackedTokens,
    blocks_of_state,
    pack_spec,
    packing_state,
    token_lengths,
)
from loader.plan import PlanSpec
from loader.progress import ROWS, Batching, Progress
from loader.reader import ON_ERROR, BatchReader, OnError
from loader.sources import ResolvedSource, identity_for, resolve_source
from loader.world import World, agree_with_rank0, resolve_world

ROW_READ_SIZE = 1024  # rows per read when iterating the dataset row by row
SEED_PICKED = 2**63  # a picked seed lies in [0, 2**63): any JSON reader keeps it exact


class StreamingDataset(IterableDataset[dict[str, Any]]):
    """This rank's rows; see the README for the order, the state and elastic resume.

    `shuffle_seed=None` picks a random seed on rank 0 (shared by broadcast); it is saved in
    the state, and loading a state adopts the saved seed.
    """

    def __init__(
        self,
        source: Any,
        columns: list[str] | None = None,
        filter: Any = None,
        num_splits: int | None = None,
        shuffle: bool = True,
        shuffle_seed: int | None = 0,
        shuffle_clump_size: int | None = None,
        epoch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        on_error: OnError = "raise",
        version: int | None = None,
        allow_source_change: bool = False,
        storage_options: dict[str, str] | None = None,
        pack_sequences: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        blocks_per_epoch: int | None = None,
    ) -> None:
        if source is None:
            raise ValueError(
                "source is None; pass a LanceDB table, a Lance dataset, an Arrow table or "
                "dataset, or a path to a .lance folder or Parquet files"
            )
        self.world: World = resolve_world(
            args.optional_integer("rank", rank, 0),
            args.optional_integer("world_size", world_size, 1),
        )
        num_splits = args.optional_integer("num_splits", num_splits, 1)
        if num_splits is None:
            num_splits = self.world.world_size
            warnings.warn(
                f"num_splits not set: using world_size={num_splits}. A resume on another number "
                f"of GPUs needs the same num_splits; set it explicitly (e.g. num_splits=48)",
                stacklevel=2,
            )
        check_world_size(num_splits, self.world.world_size)
        columns = args.columns(columns)
        self._pack = pack_spec(
            pack_sequences, eos_id, pad_id, blocks_per_epoch, columns, num_splits
        )
        if self._pack is not None and transform is not None:
            raise ValueError("transform (per row) cannot be combined with pack_sequences")
        self._source_args = {
            "columns": columns,
            "filter": filter,
            "storage_options": storage_options,
        }
        self._raw_source = source
        self.allow_source_change = args.boolean("allow_source_change", allow_source_change)
        self.transform = args.callable_or_none("transform", transform)
        self.on_error: OnError = args.one_of("on_error", on_error, ON_ERROR)
        self._seed_picked = shuffle_seed is None
        seed = self._pick_seed() if shuffle_seed is None else shuffle_seed
        self._shuffle = (
            args.boolean("shuffle", shuffle),
            args.integer("shuffle_seed", seed, 0, args.SEED_LIMIT),
            args.optional_integer("shuffle_clump_size", shuffle_clump_size, 1)
            or (PACKED_CLUMP if self._pack is not None else 1),
        )
        self._num_splits = num_splits
        start_epoch = args.integer("epoch", epoch, 0)
        resolved, plan = self._resolve(version)
        if version is None:  # a fresh start: every rank reads the version rank 0 sees
            agreed = agree_with_rank0(resolved.spec.version)
            if agreed != resolved.spec.version:
                resolved, plan = self._resolve(agreed)
        self._adopt(resolved, plan)
        self.progress = Progress(
            self.world, num_splits, plan.rows_per_split, start_epoch, self.units_per_split
        )

    def _pick_seed(self) -> int:
        """A random seed, the same on every rank: rank 0's, by broadcast."""
        if self.world.world_size > 1 and not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "shuffle_seed=None picks a seed on rank 0 and shares it through "
                "torch.distributed, which is not initialised here; pass shuffle_seed=<int> "
                "(the same on every rank) or call init_process_group first"
            )
        return int(agree_with_rank0(secrets.randbelow(SEED_PICKED)))

    def __getstate__(self) -> dict[str, Any]:
        """Copies (plain DataLoader workers under spawn) read through the picklable reader;
        the user's table handle stays with the original, which alone may re-pin."""
        state = self.__dict__.copy()
        state["_raw_source"] = None
        return state

    # -- the source and the plan ------------------------------------------------------

    def _resolve(
        self, version: int | None, seed: int | None = None
    ) -> tuple[ResolvedSource, PlanSpec]:
        """The source at `version` and the plan on its filtered row count (changes nothing)."""
        if self._raw_source is None:
            raise RuntimeError(
                "this StreamingDataset is a pickled copy (e.g. inside a DataLoader worker) and "
                "cannot reopen its source; load states into the original in the main process"
            )
        resolved = resolve_source(self._raw_source, version=version, **self._source_args)
        return resolved, self._plan_on(resolved, seed)

    def _plan_on(self, resolved: ResolvedSource, seed: int | None = None) -> PlanSpec:
        shuffle, own_seed, clump = self._shuffle
        seed = own_seed if seed is None else seed
        return PlanSpec(resolved.num_rows, self._num_splits, shuffle, seed, clump)

    def _adopt(self, resolved: ResolvedSource, plan: PlanSpec) -> None:
        self.plan = plan
        self._shuffle = (plan.shuffle, plan.shuffle_seed, plan.clump_size)
        self.packing: PackedTokens | None = None
        if self._pack is None:
            self.reader = BatchReader(resolved, plan, self.transform, self.on_error)
            return
        from loader.packed_reader import PackedReader

        lengths = token_lengths(resolved, self._pack.column)  # the one-off pass, per version
        self.packing = PackedTokens(self._pack, plan, lengths)
        self.reader = PackedReader(resolved, plan, self.packing)

    def units_per_split(self, epoch: int) -> int:
        """What a split's cursor counts up to: L rows, or the epoch's blocks when packing."""
        if self.packing is not None:
            return self.packing.blocks_per_split(epoch)
        return self.rows_per_split

    @property
    def source(self) -> ResolvedSource:
        return self.reader.source

    @property
    def num_rows(self) -> int:
        return self.plan.num_rows

    @property
    def num_splits(self) -> int:
        return self.plan.num_splits

    @property
    def rows_per_split(self) -> int:
        return self.plan.rows_per_split

    @property
    def shuffle_seed(self) -> int:
        """The seed in use (the picked one when built with shuffle_seed=None)."""
        return self.plan.shuffle_seed

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def world_size(self) -> int:
        return self.world.world_size

    @property
    def splits(self) -> range:
        """The splits this rank owns."""
        return owned_splits(self.rank, self.world_size, self.num_splits)

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    def plan_identity(self, drop_last: bool) -> dict[str, Any]:
        return self._identity(self.plan, self.source, drop_last)

    def _identity(self, plan: PlanSpec, source: ResolvedSource, drop_last: bool) -> dict[str, Any]:
        return {
            "num_rows": plan.num_rows,
            "num_splits": plan.num_splits,
            "rows_per_split": plan.rows_per_split,
            "shuffle": plan.shuffle,
            "shuffle_seed": plan.shuffle_seed,
            "shuffle_clump_size": plan.clump_size,
            "filter": source.filter
            if isinstance(source.filter, str | None)
            else str(source.filter),
            "drop_last": drop_last,
            **(self._pack.identity() if self._pack is not None else {}),
        }

    # -- position and state -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the position is already in it."""
        self.progress.set_epoch(args.integer("epoch", epoch, 0))

    def make_state(self, batching: Batching) -> dict[str, Any]:
        """The state at the current position, for batches cut as `batching` says."""
        position = self.progress.state_dict(batching)
        packed: dict[str, Any] = {}
        if self.packing is not None:  # block cursors as (document, token offset) per split
            blocks = self.packing.epoch(position[st.KEY_EPOCH])
            position[st.KEY_CURSORS], packed = packing_state(blocks, position[st.KEY_CURSORS])
        state = st.make_state(
            self.plan_identity(batching.drop_last), self.source.spec.identity(), position
        )
        state.update(packed)
        return state

    def state_dict(self) -> dict[str, Any]:
        """The row-level position (the loader's `state_dict` is the one to use with batches)."""
        return self.make_state(ROWS)

    def load_state_dict(self, state: dict[str, Any], drop_last: bool | None = None) -> None:
        """Validate `state` against this dataset and move to it (effective at the next iteration).

        A LanceDB/Lance source is reopened at the state's version first, so the plan is
        rebuilt on exactly the rows the saved run was reading. A dataset built with
        `shuffle_seed=None` adopts the state's seed.
        """
        st.check_state(state)
        seed = self._saved_seed(state) if self._seed_picked else self.plan.shuffle_seed
        resolved, plan = self.source, self.plan
        saved_version = state[st.KEY_SOURCE].get("version")
        if saved_version is not None and saved_version != resolved.spec.version:
            resolved, plan = self._resolve(saved_version, seed)
        elif seed != plan.shuffle_seed:
            plan = self._plan_on(resolved, seed)
        saved_source = state[st.KEY_SOURCE]
        st.check_source(state, identity_for(resolved.spec, saved_source), self.allow_source_change)
        # packing first: a row state differs from a packed one in its clump default too
        fields = [*PACK_FIELDS, "num_splits", "shuffle", "shuffle_seed", "shuffle_clump_size"]
        fields.append("filter")
        if not self.allow_source_change:
            fields.append("num_rows")
        if drop_last is not None:
            fields.append("drop_last")
        st.check_plan(state, self._identity(plan, resolved, bool(drop_last)), tuple(fields))
        st.check_cursors(state, plan.num_splits, plan.rows_per_split)
        check_world_size(plan.num_splits, self.world_size)
        if resolved is not self.source or plan != self.plan:  # every check passed: re-pin
            self._adopt(resolved, plan)
        if self.packing is None:
            self.progress.load_state_dict(state, plan.rows_per_split)
            return
        epoch = state[st.KEY_EPOCH]
        blocks = blocks_of_state(self.packing.epoch(epoch), state, state[st.KEY_CURSORS])
        self.progress.load_state_dict(
            {**state, st.KEY_CURSORS: blocks}, self.units_per_split(epoch)
        )

    def _saved_seed(self, state: dict[str, Any]) -> int:
        seed = state[st.KEY_PLAN].get("shuffle_seed")
        try:
            return args.integer("plan.shuffle_seed", seed, 0, args.SEED_LIMIT)
        except (TypeError, ValueError) as err:
            raise ValueError(f"loader state: {err}") from None

    # -- rows ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.progress.peek(ROWS).rows

    def __iter__(self) -> Iterator[Any]:
        """This rank's remaining rows of the epoch; the position follows the rows yielded.

        Inside DataLoader workers each worker takes every w-th read of the stream, so the
        union is every row once (use StreamingDataLoader for an order independent of w).
        """
        info = get_worker_info()
        if self.packing is not None:
            yield from self._iter_blocks(info)
            return
        reads = Batching(ROW_READ_SIZE, False)  # the same rows as ROWS, read 1024 at a time
        stream = self.progress.start(reads) if info is None else self.progress.peek(reads)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(worker, stream.num_batches, workers):
            table, restore = self.reader.read(self.reader.positions(stream.task(index)))  # one read
            for row in table.take(pa.array(restore)).to_pylist():
                if info is None:
                    self.progress.record(1, stream)
                if self.transform is None:
                    yield row
                    continue
                try:
                    yield self.transform(row)
                except Exception as err:
                    if self.on_error == "raise":
                        raise
                    if self.on_error == "warn":
                        warnings.warn(f"transform failed on a row, skipped: {err!r}", stacklevel=2)

    def _iter_blocks(self, info: Any) -> Iterator[dict[str, Any]]:
        """Packed blocks one by one (each a dict of (seq_len,) tensors and its cu_seqlens)."""
        stream = self.progress.start(ROWS) if info is None else self.progress.peek(ROWS)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for first in range(worker * ROW_READ_SIZE, stream.num_batches, workers * ROW_READ_SIZE):
            for batch in self.reader[stream.task(first, ROW_READ_SIZE)]:
                if info is None:
                    self.progress.record(1, stream)
                yield {k: v if k == "cu_seqlens" else v[0] for k, v in batch.items()}

    def __repr__(self) -> str:
        spec = self.source.spec
        return (
            f"StreamingDataset({spec.kind}:{spec.uri} v{spec.version}, N={self.num_rows}, "
            f"S={self.num_splits}, rank {self.rank}/{self.world_size}, epoch {self.epoch})"
        )
