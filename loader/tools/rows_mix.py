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
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import state as st
from loader.layout import slice_bounds
from loader.mixture import state as ms
from loader.mixture.plan import MixPlan, MixPosition, SourceAt, Weights, parse_weights
from loader.mixture.weights import Phase, saved_phases
from loader.plan import PlanSpec
from loader.stream import runs_order_indices
from loader.tools.rows_base import (
    StepRows,
    in_ranges,
    open_saved,
    plan_spec,
    skip_ranges,
    table_rows,
)

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

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> MixRun:
        """A mixture state's run (`StreamingDataLoader(mixture).state_dict()`)."""
        ms.check_mixture_state(state)
        parts = state[ms.KEY_SOURCES]
        packed = [n for n, p in zip(state[ms.KEY_NAMES], parts, strict=True) if _packed(p)]
        if packed:
            raise ValueError(
                f"datasets {packed} of this mixture are packed (pack_sequences): the ledger "
                "answers mixtures of row datasets, and packed runs of one dataset"
            )
        specs = tuple(plan_spec(p[st.KEY_PLAN]) for p in parts)
        count = len(specs)
        weights = Weights.of(parse_weights(state[ms.KEY_WEIGHTS]), count, "state weights")
        phases = (
            saved_phases(state[ms.KEY_PHASES], count)
            if ms.KEY_PHASES in state
            else (Phase(state[ms.KEY_PHASE_START], weights),)  # states before schedules
        )
        plan = MixPlan(
            phases,
            tuple(spec.num_splits for spec in specs),
            lambda k, _epoch: specs[k].rows_per_split,
            state.get(ms.KEY_SEED),
            state[ms.KEY_EPOCH_RULE],
        )
        sources = []
        for spec, part in zip(specs, parts, strict=True):
            epoch, cursors = int(part[st.KEY_EPOCH]), tuple(part[st.KEY_CURSORS])
            if all(c == spec.rows_per_split for c in cursors):  # a finished pass: the next
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
            empty_passes=tuple(state.get(ms.KEY_EMPTY_PASSES, (0,) * count)),
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
            skip_ranges(state),
        )

    def at_step(self, step: int) -> MixPosition:
        """The position before global step `step` (see the module docstring)."""
        if step >= self.position.global_step:
            pos = self.position
            if self.plan.steps_left(pos, self.global_batch) == 0:  # its epoch is over
                passes = tuple(s.epoch for s in pos.sources)
                pos = replace(pos, epoch=pos.epoch + 1, step=0, epoch_passes=passes)
            return self._walk(pos, step - pos.global_step)
        here = self.position.global_step
        if self.plan.phases[0].start > 0:  # a state that knows only the phase in force
            raise ValueError(
                f"the weights of this state took effect at global step "
                f"{self.position.phase_start} (new weights at a resume): steps before "
                f"{here} need a checkpoint of the earlier run; steps from {here} on can"
            )
        start = MixPosition.start([SourceAt(0, (0,) * s.num_splits) for s in self.specs])
        if self._walk(start, here) != self.position:
            raise ValueError(
                f"{here} steps of G={self.global_batch} from every dataset's first pass do not "
                f"lead to this state (the run began elsewhere, or G changed): its earlier steps "
                f"cannot be computed from it; steps from {here} on can"
            )
        return self._walk(start, step)

    def _walk(self, pos: MixPosition, steps: int) -> MixPosition:
        for _ in range(steps):
            pos, _ = self.plan.step(pos, self.global_batch)
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
    world, g = run.world_size, run.global_batch
    if in_ranges(step, run.steps_skipped):
        return StepRows.jumped(step, pos.epoch, pos.step, world, g, id_column)
    positions, datasets, ranks = [], [], []
    for r in range(world) if rank is None else (rank,):
        _, pieces, layout = run.plan.rank_step(pos, g, *slice_bounds(r, world, g))
        rows = np.empty(len(layout), dtype=np.int64)
        for k in range(len(run.names)):  # each source's rows, in order, where the layout says k
            mine = [p for p in pieces if p.source == k]
            parts = [
                run.specs[k]
                .epoch(p.epoch)
                .order(runs_order_indices(p.runs, run.specs[k].rows_per_split))
                for p in mine
            ]
            rows[layout == k] = _joined(parts)
        positions.append(rows)
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
    )
    if id_column is None and not any(run.filters):
        return found
    return _from_sources(found, run, id_column, source or {}, storage_options)


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
            resolved = open_saved(
                run.sources[k],
                run.specs[k].num_rows,
                columns=[id_column] if id_column is not None else None,
                filter=run.filters[k],
                source=given.get(name),
                storage_options=storage_options,
            )
        except ValueError as err:
            raise ValueError(f"dataset {name!r}: {err}") from None
        table, got = table_rows(resolved, found.positions[mine], id_column)
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


def _packed(part: dict[str, Any]) -> bool:
    return part.get(st.KEY_PLAN, {}).get(st.PLAN_PACK_SEQUENCES) is not None
