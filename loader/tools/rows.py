"""Which rows were in global step T, and which rank read each (`elastic-loader rows`).

The plan is a pure function of (N, S, shuffle, seed, C, epoch) and a rank's batches a pure
function of the cursors, W and the batching (`loader.stream`), so step T's rows follow from
one known position of the run — a checkpoint's state, or an epoch's start given as plan
arguments — without reading the data before it. This module only walks from that position
to step T and asks `loader.stream` and `loader.plan` for the rows; no layout arithmetic
of its own. A mixture's state is answered by `loader.tools.rows_mix`, a packed run's
blocks are cut into their documents by `loader.tools.rows_packed`.

Which steps are answerable (the layout is the run's W and G; a resize changes it):
- from a state, every step T >= its `global_step` (the future: epochs run back to back, on
  the state's W and G), and the earlier steps of the state's epoch when the whole epoch ran
  on the state's G (checked: s steps of G rows from the epoch's start must lead to the
  saved cursors; the ranks named are then the state's W's). Steps of earlier epochs need a
  checkpoint (or the plan arguments) of that epoch. A step the state's `steps_skipped`
  holds (`skip_steps`), jumped already or pending (`skips_pending`: a resume skips it), is
  answered as skipped, with no rows; the other steps hold the rows they would without it.
- from plan arguments, every step of a run that began at the start of `epoch` and ran on
  that W and G throughout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from loader import args
from loader import state as st
from loader.mixture import state as ms
from loader.plan import PlanSpec
from loader.stream import Batching, RankStream, rank_stream, task_order_indices
from loader.tools import rows_packed
from loader.tools.rows_base import (
    StepRows,
    batching_of_state,
    in_ranges,
    open_saved,
    plan_spec,
    skip_ranges,
    table_rows,
)
from loader.tools.rows_mix import MixRun, mixture_rows

__all__ = ["MixRun", "RunPosition", "StepRows", "rows_at_step"]

_MIX_SOURCE = (
    "source for a mixture is a mapping of dataset name -> source (on the command line "
    "--source NAME=URI[,NAME=URI ...]), got {}"
)
EMPTY_EPOCHS = 64  # consecutive epochs without a step (packed) before `rows` gives up


@dataclass(frozen=True)
class RunPosition:
    """One known position of a run and what fixes its batches: the plan, W, the batching,
    and (epoch, cursors, step of that epoch, global step) — a state's, or an epoch start.
    A packed run also holds its blocks (`packing`, from the token column's lengths) and the
    source opened for them; a state's `steps_skipped` ranges are kept to answer them."""

    spec: PlanSpec
    world_size: int
    batching: Batching
    epoch: int = 0
    cursors: tuple[int, ...] | None = None  # None: the epoch's start
    step: int = 0
    global_step: int = 0
    filter: str | None = None  # the plan's filter: positions are then of the filtered rows
    source: dict[str, Any] | None = None  # the state's source identity, to reopen it
    packing: Any = None  # loader.packing.PackedTokens of a packed run
    opened: Any = None  # the source, resolved at its version (a packed run opens it)
    steps_skipped: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_state(
        cls,
        state: dict[str, Any],
        global_batch_size: int | None = None,
        *,
        source: Any = None,
        storage_options: dict[str, str] | None = None,
    ) -> RunPosition | MixRun:
        """A loader state's position (`StreamingDataLoader.state_dict()`, `checkpoint.load`):
        a `MixRun` for a mixture's state. A packed state opens its table (at the pinned
        version, or `source`) once, to cut blocks from its documents.

        `global_batch_size` is needed only for states written before they saved it.
        """
        if ms.is_mixture(state):
            if global_batch_size not in (None, state.get(st.KEY_GLOBAL_BATCH)):
                raise ValueError(
                    f"global_batch_size={global_batch_size} differs from the mixture state's "
                    f"{state.get(st.KEY_GLOBAL_BATCH)}: the state's is the run's; leave it out"
                )
            if source is not None and not isinstance(source, Mapping):
                raise ValueError(_MIX_SOURCE.format(type(source).__name__))
            return MixRun.from_state(state, source, storage_options)
        st.check_state(state)
        plan = state[st.KEY_PLAN]
        saved = state.get(st.KEY_GLOBAL_BATCH)
        if saved is not None and global_batch_size not in (None, saved):
            raise ValueError(
                f"global_batch_size={global_batch_size} differs from the state's {saved}: the "
                "state's is the run's; leave it out"
            )
        batch = saved if saved is not None else global_batch_size
        if batch is None:
            raise ValueError(
                "the state has no global_batch_size (written before states saved it): pass "
                "global_batch_size (the CLI's --global-batch), the run's W * batch_size"
            )
        spec = plan_spec(plan)
        step = int(state[st.KEY_STEP])
        run = cls(
            spec,
            int(state[st.KEY_WORLD_SIZE]),
            batching_of_state(state, bool(plan.get("drop_last", False)), batch),
            int(state[st.KEY_EPOCH]),
            tuple(state[st.KEY_CURSORS]),
            step,
            int(state.get(st.KEY_GLOBAL_STEP, step)),
            plan.get("filter"),
            dict(state[st.KEY_SOURCE]),
            steps_skipped=skip_ranges(state),
        )
        if plan.get(st.PLAN_PACK_SEQUENCES) is None:
            return run
        opened = open_saved(
            run.source,
            spec.num_rows,
            columns=[plan["token_column"]],
            filter=run.filter,
            source=source,
            storage_options=storage_options,
        )
        packing = rows_packed.packing_of(plan, spec, opened)
        cursors = rows_packed.block_cursors(packing, state)
        return replace(run, packing=packing, opened=opened, cursors=cursors)

    def units(self, epoch: int) -> int:
        """What a split's cursor counts up to in `epoch`: L rows, or the epoch's blocks."""
        if self.packing is None:
            return self.spec.rows_per_split
        return int(self.packing.blocks_per_split(epoch))

    def stream(
        self, epoch: int, cursors: tuple[int, ...], rank: int, first_step: int
    ) -> RankStream:
        """Rank `rank`'s batches of `epoch` from `cursors`, the first at global step
        `first_step` (a batch schedule is counted in global steps): what its loader yields."""
        length = self.units(epoch)
        return rank_stream(epoch, cursors, length, rank, self.world_size, self.batching, first_step)


def rows_at_step(
    run: RunPosition | MixRun,
    step: int,
    rank: int | None = None,
    *,
    id_column: str | None = None,
    source: Any = None,
    storage_options: dict[str, str] | None = None,
) -> StepRows:
    """The rows of global step `step` (0-based: the batch handed out while the loader's
    `global_step` went from `step` to `step + 1`), of every rank or of `rank` only.

    With `id_column`, or when the plan has a filter, the source is opened (read-only, at
    the state's pinned version): `source` (anything StreamingDataset takes; for a mixture
    a name -> source mapping), else the state's source URI. Only step T's rows are read,
    and only the id column. A ValueError says why a step cannot be answered from `run`
    (see the module docstring).
    """
    step = args.step("step", step, 0)  # numpy integers too; 1.5 and True are refused
    rank = args.optional_integer("rank", rank, 0)
    if rank is not None and rank >= run.world_size:
        raise ValueError(f"rank must be in [0, {run.world_size - 1}] (W), got {rank!r}")
    if isinstance(run, MixRun):
        if source is not None and not isinstance(source, Mapping):
            raise ValueError(_MIX_SOURCE.format(type(source).__name__))
        return mixture_rows(
            run, step, rank, id_column=id_column, source=source, storage_options=storage_options
        )
    at = _locate(run, step)
    epoch, index, done = at.epoch, at.index, at.done
    g = run.stream(epoch, at.start, 0, at.first_step).global_rows(index)
    if in_ranges(step, run.steps_skipped):
        return StepRows.jumped(step, epoch, done + index, run.world_size, g, id_column)
    order = run.spec.epoch(epoch)
    positions, ranks, documents = [], [], []
    for r in range(run.world_size) if rank is None else (rank,):
        task = run.stream(epoch, at.start, r, at.first_step).task(index)
        idx = task_order_indices(task, run.units(epoch))
        if run.packing is None:
            positions.append(order.order(idx))
        else:
            positions.append(idx)
            documents += rows_packed.block_pieces(run.packing, run.opened, epoch, idx)
        ranks.append(np.full(len(idx), r, dtype=np.int64))
    found = StepRows(
        step,
        epoch,
        done + index,
        run.world_size,
        g,
        np.concatenate(positions),
        np.concatenate(ranks),
        documents=documents if run.packing is not None else None,
    )
    if run.packing is not None or (id_column is None and run.filter is None):
        if id_column is not None:
            raise ValueError(
                "id_column with a packed run: its rows are blocks; `documents` names the "
                "table positions each was cut from"
            )
        return found
    resolved = open_saved(
        run.source,
        run.spec.num_rows,
        columns=[id_column] if id_column is not None else None,
        filter=run.filter,
        source=source,
        storage_options=storage_options,
    )
    table, ids = table_rows(resolved, found.positions, id_column)
    return replace(found, table_positions=table, ids=ids, id_column=id_column)


@dataclass(frozen=True)
class _Found:
    """Where a step lies: its epoch, the cursors and global step its stream starts from,
    its batch index in that stream, and the steps of the epoch before that stream."""

    epoch: int
    start: tuple[int, ...]
    first_step: int
    index: int
    done: int


def _locate(run: RunPosition, step: int) -> _Found:
    zeros = (0,) * run.spec.num_splits
    cursors = zeros if run.cursors is None else run.cursors
    if step < run.global_step:
        return _in_epoch_so_far(run, step, cursors)
    epoch, left, first = run.epoch, step - run.global_step, run.global_step
    done = run.step
    if all(c == run.units(epoch) for c in cursors):  # a finished epoch: the next one
        epoch, cursors, done = epoch + 1, zeros, 0
    here = run.stream(epoch, cursors, 0, first).num_batches
    if left < here:
        return _Found(epoch, cursors, first, left, done)
    left, first = left - here, first + here
    if run.packing is None and not run.batching.schedule:  # every epoch has the same steps
        per_epoch = run.stream(epoch + 1, zeros, 0, first).num_batches
        if per_epoch == 0:
            raise ValueError(_never(run, step))
        epochs, index = divmod(left, per_epoch)
        return _Found(epoch + 1 + epochs, zeros, first + epochs * per_epoch, index, 0)
    empty = 0
    while empty < EMPTY_EPOCHS:  # packed blocks or a batch ramp: epoch by epoch
        epoch += 1
        here = run.stream(epoch, zeros, 0, first).num_batches
        if left < here:
            return _Found(epoch, zeros, first, left, 0)
        left, first = left - here, first + here
        empty = empty + 1 if here == 0 else 0
    raise ValueError(_never(run, step))


def _never(run: RunPosition, step: int) -> str:
    return (
        f"an epoch has no step on W={run.world_size} with global batch "
        f"{run.batching.global_rows(run.world_size)}: step {step} is never reached"
    )


def _in_epoch_so_far(run: RunPosition, step: int, cursors: tuple[int, ...]) -> _Found:
    """An earlier step of the position's epoch, recomputed from the epoch's start."""
    first = run.global_step - run.step  # the global step of the epoch's first batch
    if step < first:
        raise ValueError(
            f"step {step} is before epoch {run.epoch}, which began at global step {first}: "
            "ask a checkpoint of that epoch (or pass the plan arguments with its --epoch)"
        )
    zeros = (0,) * run.spec.num_splits
    if tuple(run.stream(run.epoch, zeros, 0, first).cursors_after(run.step)) != tuple(cursors):
        raise ValueError(
            f"the state's cursors are not where {run.step} steps of "
            f"G={run.batching.global_rows(run.world_size)} rows from the start of epoch "
            f"{run.epoch} lead (the global batch changed, or a resize skipped rows, in this "
            f"epoch): its earlier steps cannot be computed from this state; steps from "
            f"{run.global_step} on can"
        )
    return _Found(run.epoch, zeros, first, step - first, 0)
