"""StreamingDataset: one rank's rows of a pinned table, in the elastic order.

Keeps the keyword names of `lancedb.streaming.StreamingDataset`, so switching is one
import. It owns the plan, the pinned source and one `Progress` (the position: epoch,
cursors, step); `StreamingDataLoader` batches it. Iterating the dataset directly yields rows
(`dataset_rows.py`). Its arguments are checked, and meet a source and a plan, in
`dataset_request.py`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from loader import args
from loader import state as st
from loader.cache import CacheSpec
from loader.dataset_request import DatasetRequest, plan_on, saved_seed, spec_fields
from loader.dataset_rows import blocks_of, rows_of
from loader.layout import owned_splits
from loader.mesh import place
from loader.packing import PackedTokens
from loader.plan import PlanSpec
from loader.progress import ROWS, Batching, Progress
from loader.read.reader import OnError
from loader.sources import ResolvedSource, identity_for
from loader.state import PlanIdentity
from loader.trainers.resharding import refuse_resharding
from loader.units import BlockUnits, Units
from loader.world import Agreement, Fields, OnWorld, World


class StreamingDataset(OnWorld, IterableDataset[dict[str, Any]]):
    """This rank's rows of a pinned table, in the elastic order (see the README's contract).

    Args:
        source: a LanceDB table, Lance dataset, Arrow table/dataset, or `.lance`/Parquet path.
        columns: the columns to read (None: all).
        filter: rows to keep (SQL for Lance/LanceDB, else an Arrow expression); N counts them.
        num_splits: S, fixed for the life of a run (default: world_size, with a warning).
        shuffle, shuffle_seed, shuffle_clump_size: the plan's order (clumps of C rows stay
            contiguous). `shuffle_seed=None`: rank 0 picks one, broadcast and saved.
        epoch: the epoch to start at (a loaded state overrides it).
        rank, world_size: this rank and W (default: torch.distributed's, else 0 and 1).
        transform, on_error: a per-row function and what a failing row does ("raise",
            "skip", "warn"; skipped rows counted in `reader.skipped_rows`).
        version: the table version to pin (default: the one rank 0 sees at start).
        allow_source_change: resume although the source's identity differs.
        storage_options: object-store options (default: the LanceDB connection's).
        cache_dir, cache_limit: a node-local folder (default `ELASTIC_LOADER_CACHE_DIR`) that
            keeps a Lance source's data files for every process of the node, and its size
            ('200GB'; default unlimited). It never changes the batches (docs/cache.md).
        pack_sequences, eos_id, pad_id, blocks_per_epoch: pack a token column into blocks of
            `pack_sequences` tokens, a split's unit (docs/packing.md).
        pack_fields, pack_dtype: a packed batch's fields (None: all five) and its token
            dtype ("int64" or "int32"); not in the state (`loader.derive_packed_fields`).
        process_group: the group the table version (and a picked seed) is agreed over:
            by default torch.distributed's group when rank/world_size are the process's (a
            dataset one rank builds alone, rank=0, world_size=1, waits for nobody); a group
            for a subset; False for none. Other rank/world_size (a data-parallel rank of a
            tensor-parallel job) need mesh=, a group of every process reading the data, or
            version= and shuffle_seed=.
        mesh, dp_dims, read_on: a `DeviceMesh`: the data is split over its data-parallel
            dims (`dp_dims`, default those named dp, dp_replicate, dp_shard, batch or data),
            rank and world_size are the process's coordinate on them, every other dim gets
            identical batches. Version and seed are agreed over the mesh, or the processes
            `read_on` lists (e.g. {"pp": [0, 3]}: only the stages that need data build it).
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
        process_group: Any = None,
        pack_fields: list[str] | tuple[str, ...] | None = None,
        pack_dtype: Any = "int64",
        mesh: Any = None,
        dp_dims: tuple[str, ...] | None = None,
        read_on: dict[str, list[int]] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        if source is None:
            raise ValueError(
                "source is None; pass a LanceDB table, a Lance dataset, an Arrow table or "
                "dataset, or a path to a .lance folder or Parquet files"
            )
        if shuffle_seed is not None:
            args.integer("shuffle_seed", shuffle_seed, 0, args.SEED_LIMIT)
        placement = place(
            rank,
            world_size,
            mesh,
            dp_dims,
            read_on,
            process_group,
            version is not None,
            shuffle_seed is not None,
        )  # not kept: the mesh and groups stay out of pickled copies
        self.world: World = placement.world
        # Who later calls made alike (a loader's batch sizes, set_weights) are checked with:
        # the processes that build this dataset, and only they.
        self.peers: Agreement | None = placement.agreement
        self._asked = DatasetRequest.check(
            self.world,
            columns=columns,
            filter=filter,
            num_splits=num_splits,
            shuffle=shuffle,
            shuffle_seed=shuffle_seed,
            shuffle_clump_size=shuffle_clump_size,
            epoch=epoch,
            transform=transform,
            on_error=on_error,
            allow_source_change=allow_source_change,
            storage_options=storage_options,
            pack_sequences=pack_sequences,
            eos_id=eos_id,
            pad_id=pad_id,
            blocks_per_epoch=blocks_per_epoch,
            pack_fields=pack_fields,
            pack_dtype=pack_dtype,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
        )
        self._raw_source = source
        self.allow_source_change = self._asked.allow_source_change
        self._request = self._asked.shuffle  # the plan's, once adopted (seed, packed clump)
        resolved, plan = self._resolve(version)
        # A fresh start: every process reads the version (and seed) the first one sees, so a
        # write landing while processes start cannot hand two of them two different tables.
        agreed, seed = placement.agreement.agree(
            resolved.spec.version,
            version is not None,
            shuffle_seed,
            self._spec_fields(resolved, version, shuffle_seed),
        )
        if agreed != resolved.spec.version:
            resolved, plan = self._resolve(agreed, seed)
        elif seed != plan.shuffle_seed:
            plan = self._plan_on(resolved, seed)
        self._adopt(resolved, plan)
        self._state_loaded = False
        self._mixture: tuple[Any, int] | None = None  # (MixedDataset, index) it belongs to
        self.progress = Progress(
            self.world,
            self._asked.num_splits,
            plan.rows_per_split,
            self._asked.start_epoch,
            self.units_per_split,
        )

    def _spec_fields(
        self, resolved: ResolvedSource, version: int | None, seed: int | None
    ) -> Fields:
        """Which dataset this is, as named digests the processes that build it compare."""
        return spec_fields(self._asked, self._request, resolved, version, seed)

    @property
    def transform(self) -> Callable[[dict[str, Any]], Any] | None:
        return self._asked.units.transform

    @property
    def on_error(self) -> OnError:
        return self._asked.units.on_error

    def __getstate__(self) -> dict[str, Any]:
        """Copies (plain DataLoader workers under spawn) read through the picklable reader;
        the user's table handle stays with the original, which alone may re-pin."""
        state = self.__dict__.copy()
        state["_raw_source"] = None
        state["peers"] = None  # process groups stay with the original
        state["_mixture"] = None  # a copy reads tasks; the mixture's position stays here
        return state

    # -- the source and the plan ------------------------------------------------------

    def _resolve(
        self, version: int | None, seed: int | None = None
    ) -> tuple[ResolvedSource, PlanSpec]:
        """The source at `version` and the plan on its filtered row count (changes nothing)."""
        resolved = self._asked.source.resolve(self._raw_source, version)
        return resolved, self._plan_on(resolved, seed)

    def _plan_on(self, resolved: ResolvedSource, seed: int | None = None) -> PlanSpec:
        return plan_on(resolved, self._request, self._asked.num_splits, seed)

    def _adopt(self, resolved: ResolvedSource, plan: PlanSpec, lengths: Any = None) -> None:
        self.plan = plan
        self._request = plan.request
        self.units: Units = self._asked.units.bind(resolved, plan, lengths)

    @property
    def reader(self) -> Any:
        """What reads this dataset's BatchTasks (rows or packed blocks)."""
        return self.units.reader

    @property
    def packing(self) -> PackedTokens | None:
        """The packed token blocks, when packing."""
        return self.units.packing if isinstance(self.units, BlockUnits) else None

    def use_shuffle(self, shuffle: bool) -> None:
        """Turn shuffling on or off, as LitData's `StreamingDataLoader(ds, shuffle=...)` does:
        only while nothing has been read and no state loaded (the plan is then still free to
        change; the seed is kept). After that the order is fixed, so a change is refused."""
        if shuffle == self.plan.shuffle:
            return
        if self._state_loaded or not self.progress.untouched():
            raise ValueError(
                f"shuffle={shuffle} contradicts the dataset, built with shuffle="
                f"{self.plan.shuffle}, and rows have already been read from it (or a state "
                f"loaded), so its order cannot change now; pass shuffle={shuffle} to "
                f"StreamingDataset (or leave shuffle out of StreamingDataLoader)"
            )
        lengths = self.packing.lengths if self.packing is not None else None
        self._adopt(self.source, dataclasses.replace(self.plan, shuffle=shuffle), lengths)

    def units_per_split(self, epoch: int) -> int:
        """What a split's cursor counts up to: L rows, or the epoch's blocks when packing."""
        return self.units.per_split(epoch)

    @property
    def cache_spec(self) -> CacheSpec | None:
        """The node cache the source is read through (None: none)."""
        return self._asked.source.cache

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
    def splits(self) -> range:
        """The splits this rank reads when iterated row by row (a StreamingDataLoader's
        `splits` says which it reads with its global batch)."""
        return owned_splits(self.rank, self.world_size, self.num_splits, self._row_global())

    def _row_global(self) -> int | None:
        """The global batch of row-by-row iteration: none (one row a rank) where W divides
        S; otherwise a step of one row of every split, for the state's `skipped` only."""
        if self.num_splits % self.world_size == 0:
            return None
        return self.num_splits * -(-self.world_size // self.num_splits)

    def row_batching(self, read_size: int = 1) -> Batching:
        """How row-by-row iteration cuts the stream: `read_size` rows per read."""
        if self._row_global() is not None:
            raise ValueError(
                f"iterating a StreamingDataset row by row needs world_size={self.world_size} "
                f"to divide num_splits={self.num_splits}; for any world size, batch it with "
                f"StreamingDataLoader(ds, global_batch_size=G), G a multiple of num_splits"
            )
        return Batching(read_size, False)

    @property
    def epoch(self) -> int:
        """The epoch of the batch in hand; in a mixture, the pass its next row comes from."""
        here = self._in_mixture()
        return self.progress.epoch if here is None else here[0]

    def join_mixture(self, mixture: Any, index: int) -> None:
        """Be dataset `index` of `mixture`: the mixture reads this dataset's passes, so its
        `epoch` and `len()` follow the mixture's position (also after a state is loaded)."""
        self._mixture = (mixture, index)

    def _in_mixture(self) -> tuple[int, tuple[int, ...]] | None:
        """(pass, cursors) of this dataset in its mixture's position, or None alone."""
        if self._mixture is None:
            return None
        mixture, index = self._mixture
        at = mixture.progress.mix_position().sources[index]
        return at.epoch, tuple(at.cursors)

    def plan_identity(self, drop_last: bool) -> PlanIdentity:
        return self._identity(self.plan, self.source, drop_last)

    def _identity(self, plan: PlanSpec, source: ResolvedSource, drop_last: bool) -> PlanIdentity:
        kept = source.filter if isinstance(source.filter, str | None) else str(source.filter)
        return plan.identity(kept, drop_last, self._asked.units.identity())

    # -- position and state -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the position is already in it."""
        refuse_resharding(self.rank, self.world_size)  # Accelerate's wrappers call this first
        self.progress.set_epoch(args.integer("epoch", epoch, 0))

    def make_state(self, batching: Batching) -> dict[str, Any]:
        """The state at the current position, for batches cut as `batching` says."""
        return self._state_of(self.progress.state_dict(batching), batching.drop_last)

    def state_at(self, epoch: int, cursors: list[int]) -> dict[str, Any]:
        """The state of this dataset read alone on one rank at (epoch, cursors in units of
        `units_per_split`): what a mixture saves for each of its datasets."""
        position = {
            st.KEY_EPOCH: epoch,
            st.KEY_CURSORS: list(cursors),
            st.KEY_SKIPPED: 0,
            st.KEY_WORLD_SIZE: 1,
            st.KEY_STEP: 0,
            st.KEY_GLOBAL_STEP: 0,
            st.KEY_GLOBAL_BATCH: self.num_splits,
        }
        return self._state_of(position, False)

    def _state_of(self, position: dict[str, Any], drop_last: bool) -> dict[str, Any]:
        position[st.KEY_CURSORS], extra = self.units.to_state(
            position[st.KEY_EPOCH], position[st.KEY_CURSORS]
        )
        state = st.make_state(self.plan_identity(drop_last), self.source.spec.identity(), position)
        state.update(extra)
        return state

    def state_dict(self) -> dict[str, Any]:
        """The row-level position (the loader's `state_dict` is the one to use with batches)."""
        global_batch = self._row_global()
        return self.make_state(
            ROWS if global_batch is None else Batching(None, False, global_batch)
        )

    def load_state_dict(self, state: dict[str, Any], drop_last: bool | None = None) -> None:
        """Validate `state` against this dataset and move to it (effective at the next iteration).

        A LanceDB/Lance source is reopened at the state's version first, so the plan is
        rebuilt on exactly the rows the saved run was reading. A dataset built with
        `shuffle_seed=None` adopts the state's seed.
        """
        if isinstance(state, dict) and state.get(st.KEY_FORMAT) == st.MIXTURE_FORMAT:
            raise ValueError(
                "this is a mixture's state (format elastic-loader/mixture/dataset): load it into the "
                "MixedDataset, or its part state['sources'][k] into dataset k"
            )
        st.check_state(state)
        seed = saved_seed(state) if self._asked.seed_picked else self.plan.shuffle_seed
        resolved, plan = self.source, self.plan
        saved_version = state[st.KEY_SOURCE].get("version")
        if saved_version is not None and saved_version != resolved.spec.version:
            resolved, plan = self._resolve(saved_version, seed)
        elif seed != plan.shuffle_seed:
            plan = self._plan_on(resolved, seed)
        saved_source = state[st.KEY_SOURCE]
        st.check_source(state, identity_for(resolved.spec, saved_source), self.allow_source_change)
        st.compare_plan(
            state,
            self._identity(plan, resolved, bool(drop_last)),
            num_rows=not self.allow_source_change,
            drop_last=drop_last is not None,
        )
        st.check_cursors(state, plan.num_splits, plan.rows_per_split)
        if resolved is not self.source or plan != self.plan:  # every check passed: re-pin
            self._adopt(resolved, plan)
        self._state_loaded = True  # the plan is the state's from now on (see use_shuffle)
        epoch = state[st.KEY_EPOCH]
        self.progress.load_state_dict(
            {**state, st.KEY_CURSORS: self.units.from_state(state)}, self.units_per_split(epoch)
        )

    # -- rows ---------------------------------------------------------------------------

    def __len__(self) -> int:
        """Rows (blocks) this rank reads of the rest of the epoch; in a mixture, those of
        the current pass not yet supplied (the mixture deals them out to all ranks)."""
        here = self._in_mixture()
        if here is not None:
            epoch, cursors = here
            return self.num_splits * self.units_per_split(epoch) - sum(cursors)
        return self.progress.peek(self.row_batching()).rows

    def __iter__(self) -> Iterator[Any]:
        """This rank's remaining rows of the epoch; the position follows the rows yielded
        (`loader/dataset_rows.py`; inside DataLoader workers each takes every w-th read)."""
        refuse_resharding(self.rank, self.world_size)
        read = blocks_of if isinstance(self.units, BlockUnits) else rows_of
        yield from read(self.progress, self.reader, self.row_batching(), get_worker_info())

    def __repr__(self) -> str:
        spec = self.source.spec
        return (
            f"StreamingDataset({spec.kind}:{spec.uri} v{spec.version}, N={self.num_rows}, "
            f"S={self.num_splits}, rank {self.rank}/{self.world_size}, epoch {self.epoch})"
        )
