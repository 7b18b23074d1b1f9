"""The ledger of a mixture (`rows_at_step` on a mixture's state): which rows of which
dataset global step T held, and which rank read each.

A mixture's step is a pure function of its position (`loader.mixture.plan`): this module
walks `MixPlan.step` from a known position to step T and takes each rank's slice with the
plan's own `rank_step` (its pieces, placed where the step's interleaved layout names their
dataset), so it lays steps out exactly as the loader does. It rebuilds the plan and the position from the state alone (weights, seed,
epoch rule, each dataset's plan and cursors), without opening a table; only ids and a
filter's table positions need the sources.

Answerable: every step from the state's `global_step` on (on its W and G), and the earlier
ones when the run began with every dataset at its first pass, kept its G, and the state
holds its weight phases from step 0 (checked: walking the steps from the start must lead to
the saved position).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import state as st
from loader.layout import slice_bounds
from loader.mixture import state as ms
from loader.mixture.plan import MixPlan, MixPosition, SourceAt, Weights, parse_weights
from loader.mixture.weights import Phase, saved_phases
from loader.plan import PlanSpec
from loader.stream import Batching, runs_order_indices
from loader.tools import rows_base, rows_packed
from loader.tools.rows_base import StepRows

__all__ = ["MixRun", "mixture_rows"]


@dataclass(frozen=True)
class MixRun:
    """A mixture's known position and what fixes its steps: the plan (weights, splits,
    seed, epoch rule), W, G, each dataset's plan, filter and source identity, and the
    global steps `skip_steps` jumped over."""

    names: tuple[str, ...]
    plan: MixPlan
    position: MixPosition
    world_size: int
    global_batch: int
    specs: tuple[PlanSpec, ...]
    filters: tuple[str | None, ...]
    sources: tuple[dict[str, Any], ...]
    steps_skipped: tuple[tuple[int, int], ...] = ()
    packed: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # k -> (blocks, source)
    batching: Batching | None = None  # a batch schedule's; None: `global_batch` throughout

    def rows(self, step: int) -> int:
        """G of global step `step`."""
        if self.batching is None:
            return self.global_batch
        return self.batching.rows_at(step, self.world_size)

    @classmethod
    def from_state(
        cls,
        state: dict[str, Any],
        source: Mapping[str, Any] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> MixRun:
        """A mixture state's run (`StreamingDataLoader(mixture).state_dict()`). Its packed
        datasets' tables are opened (at their pinned versions, or `source[name]`) to cut
        their blocks, as their loaders do."""
        ms.check_mixture_state(state)
        parts = state[ms.KEY_SOURCES]
        specs = tuple(rows_base.plan_spec(p[st.KEY_PLAN]) for p in parts)
        packed: dict[int, tuple[Any, Any]] = {}  # k -> (its PackedTokens, its opened source)
        for k, (name, part) in enumerate(zip(state[ms.KEY_NAMES], parts, strict=True)):
            plan = part[st.KEY_PLAN]
            if plan.get(st.PLAN_PACK_SEQUENCES) is None:
                continue
            try:
                opened = rows_base.open_saved(
                    part[st.KEY_SOURCE],
                    specs[k].num_rows,
                    columns=[plan["token_column"]],
                    filter=plan.get("filter"),
                    source=(source or {}).get(name),
                    storage_options=storage_options,
                )
            except ValueError as err:
                raise ValueError(f"dataset {name!r}: {err}") from None
            packed[k] = (rows_packed.packing_of(plan, specs[k], opened), opened)

        def units(k: int, epoch: int) -> int:
            if k in packed:
                return int(packed[k][0].blocks_per_split(epoch))
            return specs[k].rows_per_split

        weights = Weights.of(parse_weights(state[ms.KEY_WEIGHTS]), len(specs), "state weights")
        phases = (
            saved_phases(state[ms.KEY_PHASES], len(specs))
            if ms.KEY_PHASES in state
            else (Phase(state[ms.KEY_PHASE_START], weights),)  # states before schedules
        )
        plan = MixPlan(
            phases,
            tuple(spec.num_splits for spec in specs),
            units,
            state.get(ms.KEY_SEED),
            state[ms.KEY_EPOCH_RULE],
        )
        sources = []
        for k, (spec, part) in enumerate(zip(specs, parts, strict=True)):
            epoch, cursors = int(part[st.KEY_EPOCH]), tuple(part[st.KEY_CURSORS])
            if k in packed:
                cursors = rows_packed.block_cursors(packed[k][0], part)
            if all(c == units(k, epoch) for c in cursors):  # a finished pass: the next
                epoch, cursors = epoch + 1, (0,) * spec.num_splits
            sources.append(SourceAt(epoch, cursors))
        position = MixPosition(
            epoch=state[st.KEY_EPOCH],
            step=state[st.KEY_STEP],
            global_step=state[st.KEY_GLOBAL_STEP],
            phase_start=state[ms.KEY_PHASE_START],
            counts=tuple(state[ms.KEY_PHASE_COUNTS]),
            sources=tuple(sources),
            epoch_passes=tuple(state[ms.KEY_EPOCH_PASSES]),
            supplied=tuple(state[ms.KEY_SUPPLIED]),
            empty_passes=tuple(state.get(ms.KEY_EMPTY_PASSES, (0,) * len(specs))),
        )
        return cls(
            tuple(state[ms.KEY_NAMES]),
            plan,
            position,
            state[st.KEY_WORLD_SIZE],
            state[st.KEY_GLOBAL_BATCH],
            specs,
            tuple(p[st.KEY_PLAN].get("filter") for p in parts),
            tuple(dict(p[st.KEY_SOURCE]) for p in parts),
            rows_base.skip_ranges(state),
            packed,
            rows_base.batching_of_state(state, False, state[st.KEY_GLOBAL_BATCH]),
        )

    def at_step(self, step: int) -> MixPosition:
        """The position before global step `step` (see the module docstring)."""
        if step >= self.position.global_step:
            pos = self.position
            if self.plan.steps_left(pos, self.rows(pos.global_step)) == 0:  # epoch over
                passes = tuple(s.epoch for s in pos.sources)
                pos = replace(pos, epoch=pos.epoch + 1, step=0, epoch_passes=passes)
            return self._walk(pos, step - pos.global_step)
        here = self.position.global_step
        if self.plan.phases[0].start > 0:  # a state that knows only the phase in force
            raise ValueError(
                f"this state keeps its weights only from global step "
                f"{self.plan.phases[0].start} on (saved before weight phases were kept): "
                f"steps before {here} need a checkpoint of the earlier run; steps from "
                f"{here} on can"
            )
        start = MixPosition.start([SourceAt(0, (0,) * s.num_splits) for s in self.specs])
        if self._walk(start, here) != self.position:
            raise ValueError(
                f"{here} steps of the run's G from every dataset's first pass do not "
                f"lead to this state (the run began elsewhere, or G changed): its earlier steps "
                f"cannot be computed from it; steps from {here} on can"
            )
        return self._walk(start, step)

    def _walk(self, pos: MixPosition, steps: int) -> MixPosition:
        for _ in range(steps):
            pos, _ = self.plan.step(pos, self.rows(pos.global_step))
        return pos


def mixture_rows(
    run: MixRun,
    step: int,
    rank: int | None = None,
    *,
    id_column: str | None = None,
    source: Mapping[str, Any] | None = None,
    storage_options: dict[str, str] | None = None,
) -> StepRows:
    """Global step `step` of a mixture, of every rank or of `rank` (as `rows_at_step`).
    `source`: a name -> source mapping for the datasets whose saved URI cannot be opened."""
    pos = run.at_step(step)
    world, g = run.world_size, run.rows(step)
    if rows_base.in_ranges(step, run.steps_skipped):
        return StepRows.jumped(step, pos.epoch, pos.step, world, g, id_column)
    positions, datasets, ranks, documents = [], [], [], []
    for r in range(world) if rank is None else (rank,):
        _, pieces, layout = run.plan.rank_step(pos, g, *slice_bounds(r, world, g))
        rows = np.empty(len(layout), dtype=np.int64)
        cut: list[Any] = [None] * len(layout)
        for k in range(len(run.names)):  # each dataset's rows, in order, where the layout says k
            mine, pieces_of_k = [], []
            for p in (p for p in pieces if p.source == k):
                got, docs = _piece_rows(run, p)
                mine.append(got)
                pieces_of_k += docs
            where = np.flatnonzero(layout == k)
            rows[where] = _joined(mine)
            for at, docs in zip(where.tolist(), pieces_of_k, strict=True):
                cut[at] = docs
        positions.append(rows)
        documents += cut
        datasets.append(layout.astype(np.int64))
        ranks.append(np.full(len(layout), r, dtype=np.int64))
    found = StepRows(
        step,
        pos.epoch,
        pos.step,
        world,
        g,
        _joined(positions),
        _joined(ranks),
        datasets=_joined(datasets),
        names=run.names,
        documents=documents if run.packed else None,
    )
    if run.packed:
        if id_column is not None:
            raise ValueError(
                "id_column with packed datasets: their rows are blocks; `documents` names "
                "the table positions each was cut from"
            )
        return found
    if id_column is None and not any(run.filters):
        return found
    return _from_sources(found, run, id_column, source or {}, storage_options)


def _piece_rows(run: MixRun, piece: Any) -> tuple[NDArray[np.int64], list[Any]]:
    """A rank's piece of a step: its rows (table positions; packed: block numbers) in stream
    order, and for packed datasets the documents each block was cut from ([] for rows). A
    piece of whole passes (`passes` > 1) is read in each of its epochs, end to end."""
    k = piece.source
    got, docs = [], []
    for epoch in range(piece.epoch, piece.epoch + piece.passes):
        idx = runs_order_indices(piece.runs, run.plan.units(k, epoch))
        if k in run.packed:  # blocks: their number, and the documents cut into them
            blocks, opened = run.packed[k]
            got.append(idx)
            docs += rows_packed.block_pieces(blocks, opened, epoch, idx)
        else:
            got.append(run.specs[k].epoch(epoch).order(idx))
            docs += [[] for _ in idx]
    return _joined(got), docs


def _joined(parts: list[NDArray[np.int64]]) -> NDArray[np.int64]:
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _from_sources(
    found: StepRows,
    run: MixRun,
    id_column: str | None,
    given: Mapping[str, Any],
    storage_options: dict[str, str] | None,
) -> StepRows:
    """Table positions (through each dataset's filter) and ids, dataset by dataset."""
    assert found.datasets is not None
    mapped = found.positions.copy()
    ids: list[Any] = [None] * len(mapped)
    for k, name in enumerate(run.names):
        mine = np.flatnonzero(found.datasets == k)
        if not len(mine):
            continue
        try:
            resolved = rows_base.open_saved(
                run.sources[k],
                run.specs[k].num_rows,
                columns=[id_column] if id_column is not None else None,
                filter=run.filters[k],
                source=given.get(name),
                storage_options=storage_options,
            )
        except ValueError as err:
            raise ValueError(f"dataset {name!r}: {err}") from None
        table, got = rows_base.table_rows(resolved, found.positions[mine], id_column)
        if table is not None:
            mapped[mine] = table
        for at, value in zip(mine.tolist(), got or [], strict=False):
            ids[at] = value
    return replace(
        found,
        table_positions=mapped if any(run.filters) else None,
        ids=ids if id_column is not None else None,
        id_column=id_column,
    )
