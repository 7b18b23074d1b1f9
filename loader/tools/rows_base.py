"""What the ledger answers (`StepRows`), and its reads of a saved source: reopened
read-only at its pinned version, for the table positions behind plan positions (a filter),
an id column at just those rows, and a packed run's document lengths. The lowest of the
ledger's modules (`loader.tools.rows_mix` and `loader.tools.rows` import it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import state as st
from loader.plan import PlanSpec
from loader.stream import Batching

__all__ = [
    "StepRows",
    "batching_of_state",
    "in_ranges",
    "open_saved",
    "plan_spec",
    "skip_ranges",
    "table_rows",
]

Document = tuple[int, int, int]  # (table position, first token, stop token) of a block's piece


@dataclass(frozen=True)
class StepRows:
    """The rows of global step `step`: `positions[i]` was read by rank `ranks[i]`; rank 0's
    rows first, each rank's in the order its batch holds them. `positions` are plan
    positions: table positions unless the plan has a filter (then `table_positions`,
    once the source was opened to evaluate it). `ids`: the id column's values, if asked.

    A mixture's step also says each row's dataset (`datasets[i]`, an index into `names`);
    its positions are that dataset's. A packed run's rows are blocks: `positions[i]` is the
    block's number in its epoch (split * blocks_per_split + block of the split) and
    `documents[i]` the pieces it was cut from, (table position, first token, stop token)
    each, a document's eos being its last token. A step that `skip_steps` jumped over is
    `skipped`, with no rows: no rank read it."""

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
    skipped: bool = False
    datasets: NDArray[np.int64] | None = None
    names: tuple[str, ...] | None = None
    documents: list[list[Document]] | None = field(default=None, repr=False)

    @classmethod
    def jumped(
        cls, step: int, epoch: int, epoch_step: int, world: int, batch: int, id_column: str | None
    ) -> StepRows:
        """A step `skip_steps` jumped over: no rows, no ranks (and no ids, if asked)."""
        empty = np.empty(0, dtype=np.int64)
        ids: list[Any] | None = None if id_column is None else []
        return cls(step, epoch, epoch_step, world, batch, empty, empty, None, ids, id_column, True)


def plan_spec(plan: dict[str, Any]) -> PlanSpec:
    """The plan of a checked state's `plan` identity."""
    return PlanSpec(
        plan["num_rows"],
        plan["num_splits"],
        bool(plan.get("shuffle", True)),
        int(plan.get("shuffle_seed", 0)),
        int(plan.get("shuffle_clump_size") or 1),
    )


def batching_of_state(state: dict[str, Any], drop_last: bool, batch: int) -> Batching:
    """A state's batching: its G, or its batch schedule ([[0, G0], [step, G], ...])."""
    schedule = state.get(st.KEY_BATCH_SCHEDULE)
    if not schedule:
        return Batching(None, drop_last, batch)
    changes = tuple((int(at), int(g)) for at, g in schedule[1:])
    return Batching(None, drop_last, int(schedule[0][1]), changes)


def skip_ranges(state: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    """The [start, stop) ranges a state's run skips: those jumped already (`steps_skipped`)
    and those still to come (`skips_pending`), which a loader resumed from it skips on any W."""
    keys = ("steps_skipped", "skips_pending")  # the same keys in a mixture's state
    return tuple((int(r[0]), int(r[1])) for key in keys for r in state.get(key, []))


def in_ranges(step: int, ranges: Any) -> bool:
    """Whether `step` lies in one of the [start, stop, ...] ranges (a state's steps_skipped)."""
    return any(r[0] <= step < r[1] for r in ranges)


def open_saved(
    saved: dict[str, Any] | None,
    num_rows: int,
    *,
    columns: list[str] | None = None,
    filter: str | None = None,
    source: Any = None,
    storage_options: dict[str, str] | None = None,
) -> Any:
    """The saved source (a state's `source` identity) resolved at its pinned version with
    the plan's filter: `source` when given (anything StreamingDataset takes), else the
    saved URI. A ValueError says why it cannot be, or that it is not the run's table."""
    from loader.sources.registry import resolve_source  # pyarrow, Lance: lazily

    saved = saved or {}
    if source is None:
        if saved.get("kind") == "arrow" or not saved.get("uri"):
            raise ValueError(
                "the state's source is an in-memory Arrow table, which cannot be reopened: "
                "pass it as `source` (the CLI cannot read its ids)"
            )
        source = saved["uri"]
    resolved = resolve_source(
        source,
        columns=columns,
        filter=filter,
        version=saved.get("version"),
        storage_options=storage_options,
    )
    if resolved.num_rows != num_rows:
        raise ValueError(
            f"the source has {resolved.num_rows:,} rows (after the filter), the plan "
            f"{num_rows:,}: it is not the run's table (or version)"
        )
    return resolved


def table_rows(
    resolved: Any, positions: NDArray[np.int64], id_column: str | None
) -> tuple[NDArray[np.int64] | None, list[Any] | None]:
    """(table positions of plan `positions`, None without a filter; the id column's values
    at them, None without `id_column`). One read in ascending order (as the reader does)."""
    from loader.sources.registry import open_source

    table = positions if resolved.rows is None else resolved.rows[positions]
    ids: list[Any] | None = None
    if id_column is not None:
        ascending = np.argsort(table, kind="stable")
        got = open_source(resolved.spec).take(table[ascending]).column(id_column).to_pylist()
        ids = [None] * len(got)
        for value, at in zip(got, ascending.tolist(), strict=True):
            ids[at] = value
    return (table if resolved.rows is not None else None), ids
