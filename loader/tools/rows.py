"""Which rows were in global step T, and which rank read each (`elastic-loader rows`).

The plan is a pure function of (N, S, shuffle, seed, C, epoch) and a rank's batches a pure
function of the cursors, W and the batching (`loader.stream`), so step T's rows follow from
one known position of the run — a checkpoint's state, or an epoch's start given as plan
arguments — without reading the data before it. This module only walks from that position
to step T and asks `loader.stream` and `loader.plan` for the rows; no layout arithmetic
of its own.

Which steps are answerable (the layout is the run's W and G; a resize changes it):
- from a state, every step T >= its `global_step` (the future: epochs run back to back, on
  the state's W and G), and the earlier steps of the state's epoch when the whole epoch ran
  on the state's G (checked: s steps of G rows from the epoch's start must lead to the
  saved cursors; the ranks named are then the state's W's). Steps of earlier epochs need a
  checkpoint (or the plan arguments) of that epoch.
- from plan arguments, every step of a run that began at the start of `epoch` and ran on
  that W and G throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import args
from loader import state as st
from loader.plan import PlanSpec
from loader.stream import Batching, RankStream, rank_stream, task_order_indices

__all__ = ["RunPosition", "StepRows", "rows_at_step"]


@dataclass(frozen=True)
class RunPosition:
    """One known position of a run and what fixes its batches: the plan, W, the batching,
    and (epoch, cursors, step of that epoch, global step) — a state's, or an epoch start."""

    spec: PlanSpec
    world_size: int
    batching: Batching
    epoch: int = 0
    cursors: tuple[int, ...] | None = None  # None: the epoch's start
    step: int = 0
    global_step: int = 0
    filter: str | None = None  # the plan's filter: positions are then of the filtered rows
    source: dict[str, Any] | None = None  # the state's source identity, to reopen it

    @classmethod
    def from_state(cls, state: dict[str, Any], global_batch_size: int | None = None) -> RunPosition:
        """A loader state's position (`StreamingDataLoader.state_dict()`, `checkpoint.load`).

        `global_batch_size` is needed only for states written before they saved it.
        """
        st.check_state(state)
        plan = state[st.KEY_PLAN]
        if plan.get("pack_sequences") is not None:
            raise ValueError(
                "this state is of packed token blocks (pack_sequences): `rows` answers for "
                "row datasets only"
            )
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
        spec = PlanSpec(
            plan["num_rows"],
            plan["num_splits"],
            bool(plan.get("shuffle", True)),
            int(plan.get("shuffle_seed", 0)),
            int(plan.get("shuffle_clump_size") or 1),
        )
        step = int(state[st.KEY_STEP])
        return cls(
            spec,
            int(state[st.KEY_WORLD_SIZE]),
            Batching(None, bool(plan.get("drop_last", False)), batch),
            int(state[st.KEY_EPOCH]),
            tuple(state[st.KEY_CURSORS]),
            step,
            int(state.get(st.KEY_GLOBAL_STEP, step)),
            plan.get("filter"),
            dict(state[st.KEY_SOURCE]),
        )

    def stream(self, epoch: int, cursors: tuple[int, ...], rank: int) -> RankStream:
        """Rank `rank`'s batches of `epoch` from `cursors`: what its loader yields."""
        length = self.spec.rows_per_split
        return rank_stream(epoch, cursors, length, rank, self.world_size, self.batching)


@dataclass(frozen=True)
class StepRows:
    """The rows of global step `step`: `positions[i]` was read by rank `ranks[i]`; rank 0's
    rows first, each rank's in the order its batch holds them. `positions` are plan
    positions: table positions unless the plan has a filter (then `table_positions`,
    once the source was opened to evaluate it). `ids`: the id column's values, if asked."""

    step: int
    epoch: int
    epoch_step: int  # the step within its epoch (the loader's `step` before the batch)
    world_size: int
    global_batch_size: int
    positions: NDArray[np.int64]
    ranks: NDArray[np.int64]
    table_positions: NDArray[np.int64] | None = None
    ids: list[Any] | None = None
    id_column: str | None = None


def rows_at_step(
    run: RunPosition,
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
    the state's pinned version): `source` (anything StreamingDataset takes), else the
    state's source URI. Only step T's rows are read, and only the id column.
    A ValueError says why a step cannot be answered from `run` (see the module docstring).
    """
    step = args.integer("step", step, 0)  # numpy integers too; 1.5 and True are refused
    rank = args.optional_integer("rank", rank, 0)
    if rank is not None and rank >= run.world_size:
        raise ValueError(f"rank must be in [0, {run.world_size - 1}] (W), got {rank!r}")
    epoch, start, index, done = _locate(run, step)
    order = run.spec.epoch(epoch)
    positions, ranks = [], []
    for r in range(run.world_size) if rank is None else (rank,):
        task = run.stream(epoch, start, r).task(index)
        idx = task_order_indices(task, run.spec.rows_per_split)
        positions.append(order.order(idx))
        ranks.append(np.full(len(idx), r, dtype=np.int64))
    found = StepRows(
        step,
        epoch,
        done + index,
        run.world_size,
        run.batching.global_rows(run.world_size),
        np.concatenate(positions),
        np.concatenate(ranks),
    )
    if id_column is None and run.filter is None:
        return found
    return _from_source(found, run, id_column, source, storage_options)


def _from_source(
    found: StepRows,
    run: RunPosition,
    id_column: str | None,
    source: Any,
    storage_options: dict[str, str] | None,
) -> StepRows:
    """Table positions through the plan's filter, and the id column at just those rows."""
    from loader.sources.registry import open_source, resolve_source  # pyarrow, Lance: lazily

    saved = run.source or {}
    if source is None:
        if saved.get("kind") == "arrow" or not saved.get("uri"):
            raise ValueError(
                "the state's source is an in-memory Arrow table, which cannot be reopened: "
                "pass it as `source` (the CLI cannot read its ids)"
            )
        source = saved["uri"]
    resolved = resolve_source(
        source,
        columns=[id_column] if id_column is not None else None,
        filter=run.filter,
        version=saved.get("version"),
        storage_options=storage_options,
    )
    if resolved.num_rows != run.spec.num_rows:
        raise ValueError(
            f"the source has {resolved.num_rows:,} rows (after the filter), the plan "
            f"{run.spec.num_rows:,}: it is not the run's table (or version)"
        )
    table = found.positions if resolved.rows is None else resolved.rows[found.positions]
    ids: list[Any] | None = None
    if id_column is not None:  # one read in ascending order (as the reader does), put back
        ascending = np.argsort(table, kind="stable")
        got = open_source(resolved.spec).take(table[ascending]).column(id_column).to_pylist()
        ids = [None] * len(got)
        for value, at in zip(got, ascending.tolist(), strict=True):
            ids[at] = value
    mapped = table if resolved.rows is not None else None  # else the same as `positions`
    return StepRows(
        **{**found.__dict__, "table_positions": mapped, "ids": ids, "id_column": id_column}
    )


def _locate(run: RunPosition, step: int) -> tuple[int, tuple[int, ...], int, int]:
    """(epoch, cursors its stream starts from, batch index in that stream, steps of the
    epoch before that stream) of `step`."""
    length, zeros = run.spec.rows_per_split, (0,) * run.spec.num_splits
    cursors = zeros if run.cursors is None else run.cursors
    if step < run.global_step:
        return _in_epoch_so_far(run, step, cursors)
    epoch, left = run.epoch, step - run.global_step
    done = run.step
    if all(c == length for c in cursors):  # a finished epoch: the next one is the position
        epoch, cursors, done = epoch + 1, zeros, 0
    here = run.stream(epoch, cursors, 0).num_batches
    if left < here:
        return epoch, cursors, left, done
    per_epoch = run.stream(epoch + 1, zeros, 0).num_batches  # the same for every epoch
    if per_epoch == 0:
        raise ValueError(
            f"an epoch has no step on W={run.world_size} with global batch "
            f"{run.batching.global_rows(run.world_size)}: step {step} is never reached"
        )
    left -= here
    return epoch + 1 + left // per_epoch, zeros, left % per_epoch, 0


def _in_epoch_so_far(
    run: RunPosition, step: int, cursors: tuple[int, ...]
) -> tuple[int, tuple[int, ...], int, int]:
    """An earlier step of the position's epoch, recomputed from the epoch's start."""
    first = run.global_step - run.step  # the global step of the epoch's first batch
    if step < first:
        raise ValueError(
            f"step {step} is before epoch {run.epoch}, which began at global step {first}: "
            "ask a checkpoint of that epoch (or pass the plan arguments with its --epoch)"
        )
    zeros = (0,) * run.spec.num_splits
    if tuple(run.stream(run.epoch, zeros, 0).cursors_after(run.step)) != tuple(cursors):
        raise ValueError(
            f"the state's cursors are not where {run.step} steps of "
            f"G={run.batching.global_rows(run.world_size)} rows from the start of epoch "
            f"{run.epoch} lead (the global batch changed, or a resize skipped rows, in this "
            f"epoch): its earlier steps cannot be computed from this state; steps from "
            f"{run.global_step} on can"
        )
    return run.epoch, zeros, step - first, 0


def load_position(
    where: str,
    global_batch_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> RunPosition:
    """The position of the checkpoint at `where` (a file, or a folder's / prefix's newest)."""
    from loader import checkpoint
    from loader import checkpoint_io as io

    location = io.location(where)
    if io.is_folder(location, storage_options):
        newest = checkpoint.latest(where, storage_options)
        if newest is None:
            raise checkpoint.CheckpointError(location, None, "is a folder with no checkpoint")
        location = newest
    state = checkpoint.load(location, storage_options)
    return RunPosition.from_state(state, global_batch_size)


def format_rows(found: StepRows, as_json: bool = False) -> str:
    """`elastic-loader rows`'s output: a `#` header line, then one tab-separated line a row
    (rank, position[, table_position][, the id column]); or one JSON object."""
    columns: dict[str, list[Any]] = {"rank": found.ranks.tolist()}
    columns["position"] = found.positions.tolist()
    if found.table_positions is not None:
        columns["table_position"] = found.table_positions.tolist()
    if found.ids is not None:
        columns[found.id_column or "id"] = found.ids
    if as_json:
        import json

        head = {k: v for k, v in found.__dict__.items() if isinstance(v, int)}
        rows = [
            dict(zip(columns, values, strict=True))
            for values in zip(*columns.values(), strict=True)
        ]
        return json.dumps({**head, "rows": rows}, default=str)
    lines = [
        f"# global step {found.step:,}: epoch {found.epoch}, step {found.epoch_step:,} of the "
        f"epoch; W = {found.world_size}, G = {found.global_batch_size:,}; "
        f"{len(found.positions):,} rows",
        "\t".join(columns),
    ]
    lines += ["\t".join(map(str, values)) for values in zip(*columns.values(), strict=True)]
    return "\n".join(lines)


PLAN_NEEDS = ("rows", "num_splits", "world_size", "global_batch")


def position_from_args(args: Any) -> RunPosition:
    """The CLI's position: a checkpoint's, or (`plan`) the start of `--epoch`."""
    options = dict(args.storage_option) or None
    if args.where != "plan":
        return load_position(args.where, args.global_batch, options)
    missing = [f"--{name.replace('_', '-')}" for name in PLAN_NEEDS if getattr(args, name) is None]
    if missing:
        raise ValueError(f"`plan` needs {', '.join(missing)} (the run's N, S, W and G)")
    spec = PlanSpec(args.rows, args.num_splits, not args.no_shuffle, args.seed, args.clump)
    batching = Batching(None, args.drop_last, args.global_batch)
    source = None if args.source is None else {"uri": args.source}
    return RunPosition(spec, args.world_size, batching, args.epoch, None, 0, 0, args.filter, source)


def print_rows(args: Any) -> int:
    """`elastic-loader rows`: print step T's rows; 2 (and why, on stderr) when it cannot."""
    import sys

    from loader.checkpoint_io import CheckpointError

    try:
        run = position_from_args(args)
        source = args.source if args.where != "plan" else None
        found = rows_at_step(
            run,
            args.step,
            args.rank,
            id_column=args.id_column,
            source=source,
            storage_options=dict(args.storage_option) or None,
        )
    except (CheckpointError, ValueError, OSError, KeyError) as exc:
        print(f"elastic-loader rows: error: {exc}", file=sys.stderr)
        return 2
    print(format_rows(found, args.json))
    return 0
