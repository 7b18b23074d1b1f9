"""The loader state: its keys, how it is built, and how a loaded one is checked.

Every check of a state lives here (standard library only, so `loader.checkpoint` and
`elastic-loader inspect` use them without torch): `check_state` for what a state must be
in itself, `check_plan`/`check_source`/`check_cursors` for whether it fits a dataset.

The state is per split, never per rank: `{epoch, cursors[S]}` plus what identifies the
plan and the source. It means the same on any world size (`loader.layout` says which
fit a global batch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from loader.layout import fit_reason
from loader.storage import has_scheme

FORMAT = "elastic-loader/state"
FORMAT_VERSION = 1
MIXTURE_FORMAT = "elastic-loader/mixture/dataset"  # loader.mixture.state checks those

KEY_FORMAT = "format"
KEY_FORMAT_VERSION = "format_version"
KEY_PLAN = "plan"
KEY_SOURCE = "source"
KEY_EPOCH = "epoch"
KEY_CURSORS = "cursors"
KEY_SKIPPED = "skipped"
KEY_WORLD_SIZE = "world_size"
KEY_GLOBAL_BATCH = "global_batch_size"  # G of the run that saved it
KEY_STEP = "step"
KEY_GLOBAL_STEP = "global_step"  # optional: states written before it existed lack it
KEY_STEPS_SKIPPED = "steps_skipped"  # optional: [start, stop, units] of each range jumped
MAX_SKIPPED_RANGES = 10_000
KEY_BATCH_SCHEDULE = "batch_schedule"  # optional: [[0, G0], [step, G], ...] of the run
KEY_SKIPS_PENDING = "skips_pending"  # optional: [start, stop) of each range not yet reached
KEY_AHEAD = "batches_ahead"  # optional (in_order=False): {"batch_size": b, "batches": [...]}
# packed states: per split, the token offset inside the cursor's document; tokens dropped
KEY_TOKEN_OFFSETS = "token_offsets"
# optional: the telemetry run this state belongs to, made at a fresh start (its run id) and
# kept by every resume, so a resume joins its job's run as a new attempt (issue 33)
KEY_LINEAGE = "lineage"
KEY_TOKENS_DROPPED = "tokens_dropped"

# The plan's identity (`PlanIdentity`), as the state's "plan" object spells it
PLAN_NUM_ROWS = "num_rows"
PLAN_NUM_SPLITS = "num_splits"
PLAN_ROWS_PER_SPLIT = "rows_per_split"
PLAN_SHUFFLE = "shuffle"
PLAN_SHUFFLE_SEED = "shuffle_seed"
PLAN_CLUMP = "shuffle_clump_size"
PLAN_FILTER = "filter"
PLAN_DROP_LAST = "drop_last"
PLAN_PACK_SEQUENCES = "pack_sequences"
PACK_FIELDS = (PLAN_PACK_SEQUENCES, "eos_id", "pad_id", "blocks_per_epoch", "token_column")

# Source fields that must match for a resume to read the same rows. The version is not
# here: a resume reopens the table at the state's version instead of comparing it; the
# `version_id` of that version (a Lance content identity) must then match. States written
# before `version_id` existed lack it and skip that one comparison.
SOURCE_IDENTITY = ("kind", "uri", "table", "columns", "fingerprint", "version_id")
OPTIONAL_SOURCE_FIELDS = ("version_id",)


@dataclass(frozen=True)
class PlanIdentity:
    """What a resume must find unchanged about the plan (the state's "plan" object).

    `PlanSpec.identity` makes it; `compare_plan` is the one comparison of a saved plan with
    the current one. `packing` holds the packing keywords (empty for rows).
    """

    num_rows: int
    num_splits: int
    rows_per_split: int
    shuffle: bool
    shuffle_seed: int
    shuffle_clump_size: int
    filter: str | None
    drop_last: bool
    packing: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            PLAN_NUM_ROWS: self.num_rows,
            PLAN_NUM_SPLITS: self.num_splits,
            PLAN_ROWS_PER_SPLIT: self.rows_per_split,
            PLAN_SHUFFLE: self.shuffle,
            PLAN_SHUFFLE_SEED: self.shuffle_seed,
            PLAN_CLUMP: self.shuffle_clump_size,
            PLAN_FILTER: self.filter,
            PLAN_DROP_LAST: self.drop_last,
            **dict(self.packing),
        }


def compare_plan(
    state: dict[str, Any], current: PlanIdentity, *, num_rows: bool, drop_last: bool
) -> None:
    """Raise naming the first plan field that differs between `state` and `current`.

    `num_rows=False` lets N change (allow_source_change); `drop_last=False` leaves it out
    (a dataset iterated without a loader has none).
    """
    # packing first: a row state differs from a packed one in its clump default too
    fields = [*PACK_FIELDS, PLAN_NUM_SPLITS, PLAN_SHUFFLE, PLAN_SHUFFLE_SEED, PLAN_CLUMP]
    fields.append(PLAN_FILTER)
    if num_rows:
        fields.append(PLAN_NUM_ROWS)
    if drop_last:
        fields.append(PLAN_DROP_LAST)
    check_plan(state, current.as_dict(), tuple(fields))


def make_state(
    plan: PlanIdentity, source: dict[str, Any], position: dict[str, Any]
) -> dict[str, Any]:
    """The state: what identifies plan and source, and the position (`Progress.state_dict`)."""
    return {
        KEY_FORMAT: FORMAT,
        KEY_FORMAT_VERSION: FORMAT_VERSION,
        KEY_PLAN: plan.as_dict(),
        KEY_SOURCE: dict(source),
        KEY_EPOCH: int(position[KEY_EPOCH]),
        KEY_CURSORS: [int(c) for c in position[KEY_CURSORS]],
        KEY_SKIPPED: int(position[KEY_SKIPPED]),
        KEY_WORLD_SIZE: int(position[KEY_WORLD_SIZE]),
        KEY_STEP: int(position[KEY_STEP]),
        KEY_GLOBAL_STEP: int(position[KEY_GLOBAL_STEP]),
        KEY_GLOBAL_BATCH: int(position[KEY_GLOBAL_BATCH]),
        **{
            k: position[k]
            for k in (KEY_STEPS_SKIPPED, KEY_SKIPS_PENDING, KEY_AHEAD, KEY_BATCH_SCHEDULE)
            if k in position
        },
    }


class StateError(ValueError):
    """A loader state that is wrong in itself; `field` is the dotted path of the bad value.

    `checkpoint.load` turns it into a CheckpointError naming the file and `payload.<field>`.
    """

    def __init__(self, field: str | None, problem: str) -> None:
        self.field = field
        self.problem = problem
        where = f" field {field!r}" if field else ""
        super().__init__(f"loader state{where}: {problem}")


REQUIRED = (
    KEY_FORMAT,
    KEY_FORMAT_VERSION,
    KEY_PLAN,
    KEY_SOURCE,
    KEY_EPOCH,
    KEY_CURSORS,
    KEY_SKIPPED,
    KEY_WORLD_SIZE,
    KEY_STEP,
)
INT64_LIMIT = 2**63  # counters go into int64 arrays and Numba kernels


def check_state(state: Any) -> None:
    """Raise StateError unless `state` is a well-formed state, consistent in itself.

    What a state must be whatever dataset it is loaded into: this format and a version we
    read, counters in range, one cursor per split within the split's length, a world size
    that divides S, and for a packed state one token offset per split. Extra keys (in the state, its plan or its source) are left alone, so a
    newer optional field does not break an older reader.
    """
    if not isinstance(state, dict):
        raise StateError(None, f"must be a dict, got {type(state).__name__}")
    if state.get(KEY_FORMAT) == MIXTURE_FORMAT:  # checked by loader.states (a room above)
        raise StateError(
            KEY_FORMAT,
            f"is {MIXTURE_FORMAT!r}, a mixture's state: check it with loader.states.check_state "
            "and load it into the MixedDataset (or its part state['sources'][k] into dataset k)",
        )
    missing = [key for key in REQUIRED if key not in state]
    if missing:
        raise StateError(
            missing[0], f"is missing (missing fields {missing}); is it an elastic-loader state?"
        )
    if state[KEY_FORMAT] != FORMAT:
        raise StateError(KEY_FORMAT, f"is {state[KEY_FORMAT]!r}, expected {FORMAT!r}")
    check_version(KEY_FORMAT_VERSION, state[KEY_FORMAT_VERSION], FORMAT_VERSION)
    for key in (KEY_PLAN, KEY_SOURCE):
        if not isinstance(state[key], dict):
            raise StateError(key, f"must be an object, got {type(state[key]).__name__}")
    num_splits, rows_per_split = _check_plan_shape(state[KEY_PLAN])
    _check_columns(state[KEY_SOURCE].get("columns"))
    check_count(KEY_EPOCH, state[KEY_EPOCH])
    _check_cursor_list(state[KEY_CURSORS], num_splits, rows_per_split)
    # packed states count skipped blocks, which may outnumber the documents (rows)
    packed = state[KEY_PLAN].get("pack_sequences") is not None
    skipped_limit = INT64_LIMIT - 1 if packed else num_splits * rows_per_split
    check_count(KEY_SKIPPED, state[KEY_SKIPPED], skipped_limit)
    _check_packed_fields(state, packed, num_splits)
    global_batch = None
    if KEY_GLOBAL_BATCH in state:  # optional: states written before any W was allowed lack it
        global_batch = check_count(KEY_GLOBAL_BATCH, state[KEY_GLOBAL_BATCH], low=1)
    limit = num_splits if global_batch is None else global_batch
    world_size = check_count(KEY_WORLD_SIZE, state[KEY_WORLD_SIZE], limit, low=1)
    reason = fit_reason(num_splits, world_size, global_batch)
    if reason:
        raise StateError(
            KEY_WORLD_SIZE, f"is {world_size}: no run of this plan can have saved it ({reason})"
        )
    check_count(KEY_STEP, state[KEY_STEP])
    if KEY_STEPS_SKIPPED in state:
        _check_skipped_ranges(state[KEY_STEPS_SKIPPED])
    if KEY_SKIPS_PENDING in state:
        check_pending_ranges(state[KEY_SKIPS_PENDING])
    if KEY_AHEAD in state:
        _check_ahead(state[KEY_AHEAD], num_splits * rows_per_split)
    if KEY_BATCH_SCHEDULE in state:
        _check_schedule(state[KEY_BATCH_SCHEDULE], num_splits)
    if KEY_GLOBAL_STEP in state:  # optional: states written before it existed lack it
        check_count(KEY_GLOBAL_STEP, state[KEY_GLOBAL_STEP])


def _check_schedule(schedule: Any, num_splits: int) -> None:
    """[[0, G0], [step, G], ...]: steps rising from 0, each G a multiple of S."""
    if not isinstance(schedule, list) or not schedule or len(schedule) > MAX_SKIPPED_RANGES:
        raise StateError(KEY_BATCH_SCHEDULE, f"is {schedule!r}, expected [[0, G0], [step, G], ...]")
    previous = -1
    for i, item in enumerate(schedule):
        field = f"{KEY_BATCH_SCHEDULE}[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise StateError(field, f"is {item!r}, expected [step, G]")
        step, rows = check_count(field, item[0]), check_count(field, item[1], low=1)
        if (i == 0 and step != 0) or step <= previous or rows % num_splits:
            raise StateError(
                field, f"is {item!r}: steps rise from 0 and each G is a multiple of S={num_splits}"
            )
        previous = step


def _check_ahead(ahead: Any, units: int) -> None:
    """Batches handed out past the contiguous prefix (in_order=False): distinct indices >= 1
    (batch 0 of the rest would be part of the prefix), at most one per unit left."""
    if not isinstance(ahead, dict) or set(ahead) != {"batch_size", "batches"}:
        raise StateError(KEY_AHEAD, f"is {ahead!r}, expected {{'batch_size': b, 'batches': [...]}}")
    check_count(f"{KEY_AHEAD}.batch_size", ahead["batch_size"], low=1)
    batches = ahead["batches"]
    if not isinstance(batches, list) or len(batches) > units:
        raise StateError(f"{KEY_AHEAD}.batches", f"must be a list of at most {units} indices")
    for i, index in enumerate(batches):
        check_count(f"{KEY_AHEAD}.batches[{i}]", index, units, low=1)
    if len(set(batches)) != len(batches):
        raise StateError(f"{KEY_AHEAD}.batches", "holds an index twice")


def _check_skipped_ranges(ranges: Any) -> None:
    """A list of [start, stop, units] with 0 <= start < stop (steps skipped at resumes)."""
    check_step_ranges(KEY_STEPS_SKIPPED, ranges, ("start", "stop", "units"))


def check_pending_ranges(ranges: Any) -> None:
    """A list of [start, stop] with 0 <= start < stop (ranges `skip_steps` has not reached)."""
    check_step_ranges(KEY_SKIPS_PENDING, ranges, ("start", "stop"))


def check_step_ranges(key: str, ranges: Any, parts: tuple[str, ...]) -> None:
    """`ranges` is a list of lists of counts named `parts`, each [start, stop, ...] with
    start < stop; StateError naming `key[i]` otherwise."""
    if not isinstance(ranges, list) or len(ranges) > MAX_SKIPPED_RANGES:
        raise StateError(key, f"must be a list of at most {MAX_SKIPPED_RANGES} ranges")
    for i, item in enumerate(ranges):
        field = f"{key}[{i}]"
        if not isinstance(item, list) or len(item) != len(parts):
            raise StateError(field, f"is {item!r}, expected [{', '.join(parts)}]")
        start, stop, *_ = (check_count(field, v) for v in item)
        if start >= stop:
            raise StateError(field, f"is {item!r}: start must be below stop")


def check_version(field: str, version: Any, supported: int) -> None:
    """An integer >= 1 and <= `supported`; a newer one says to upgrade."""
    if not _is_int(version) or version < 1:
        raise StateError(field, f"is {version!r}, expected an integer >= 1")
    if version > supported:
        raise StateError(
            field,
            f"format_version {version} is newer than this elastic-loader reads ({supported} at "
            "most): it was written by a newer release; upgrade elastic-loader to resume from it",
        )


def check_count(field: str, value: Any, high: int = INT64_LIMIT - 1, low: int = 0) -> int:
    """`value` if it is an integer in [low, high], else StateError naming `field` and the range."""
    if not _is_int(value) or not low <= value <= high:
        raise StateError(field, f"is {value!r}, expected an integer in [{low}, {high}]")
    return int(value)


def is_count(value: Any) -> bool:
    """An integer >= 0 (not a bool)."""
    return _is_int(value) and value >= 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_plan_shape(plan: dict[str, Any]) -> tuple[int, int]:
    """(S, L) of the plan, after checking that N, S and L agree (L = N // S)."""
    num_splits = check_count(f"{KEY_PLAN}.num_splits", plan.get("num_splits"), low=1)
    num_rows = check_count(f"{KEY_PLAN}.num_rows", plan.get("num_rows"), low=num_splits)
    rows_per_split = plan.get("rows_per_split")
    if not _is_int(rows_per_split) or rows_per_split != num_rows // num_splits:
        raise StateError(
            f"{KEY_PLAN}.rows_per_split",
            f"is {rows_per_split!r}, but num_rows // num_splits = {num_rows} // {num_splits} "
            f"= {num_rows // num_splits}",
        )
    return num_splits, rows_per_split


def _check_columns(columns: Any) -> None:
    if columns is None:
        return
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise StateError(
            f"{KEY_SOURCE}.columns", f"is {columns!r}, expected null or a list of column names"
        )


def _check_cursor_list(cursors: Any, num_splits: int, rows_per_split: int) -> None:
    if not isinstance(cursors, list) or len(cursors) != num_splits:
        got = len(cursors) if isinstance(cursors, list) else type(cursors).__name__
        raise StateError(
            KEY_CURSORS, f"has {got} cursors, expected num_splits={num_splits} (one per split)"
        )
    for split, cursor in enumerate(cursors):
        if not _is_int(cursor) or not 0 <= cursor <= rows_per_split:
            raise StateError(
                f"{KEY_CURSORS}[{split}]",
                f"the cursor of split {split} is {cursor!r}, outside [0, {rows_per_split}] "
                "(rows_per_split)",
            )


def _check_packed_fields(state: dict[str, Any], packed: bool, num_splits: int) -> None:
    """A packed state holds one token offset (a count) per split, and may hold
    `tokens_dropped` (a count); a state that is not packed holds no token offsets."""
    offsets = state.get(KEY_TOKEN_OFFSETS)
    if not packed:
        if offsets is not None:
            raise StateError(
                KEY_TOKEN_OFFSETS,
                "is set but plan.pack_sequences is null: only a packed state has token offsets",
            )
        return
    if not isinstance(offsets, list) or len(offsets) != num_splits:
        got = (
            f"has {len(offsets)} offsets"
            if isinstance(offsets, list)
            else "is missing"
            if offsets is None
            else f"is a {type(offsets).__name__}"
        )
        raise StateError(
            KEY_TOKEN_OFFSETS,
            f"{got}; a packed state (plan.pack_sequences={state[KEY_PLAN]['pack_sequences']!r}) "
            f"holds one token offset per split, num_splits={num_splits}",
        )
    for split, offset in enumerate(offsets):
        check_count(f"{KEY_TOKEN_OFFSETS}[{split}]", offset)
    if KEY_TOKENS_DROPPED in state:
        check_count(KEY_TOKENS_DROPPED, state[KEY_TOKENS_DROPPED])


def check_plan(state: dict[str, Any], plan: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Raise naming the first plan field (among `fields`) that differs."""
    saved = state[KEY_PLAN]
    for name in fields:
        if saved.get(name) != plan.get(name):
            raise ValueError(
                f"loader state was saved with plan.{name}={saved.get(name)!r} but this loader has "
                f"{name}={plan.get(name)!r}; build the dataset with the saved value to resume"
            )


def check_source(state: dict[str, Any], source: dict[str, Any], allow_change: bool) -> None:
    """Same table (and, for unpinnable sources, same fingerprint) unless allowed to differ."""
    saved = state[KEY_SOURCE]
    if allow_change:
        return
    _check_relative_uri(saved.get("uri"))
    for name in SOURCE_IDENTITY:
        if name in OPTIONAL_SOURCE_FIELDS and name not in saved:
            continue
        if saved.get(name) != source.get(name):
            raise ValueError(
                f"loader state was saved from source.{name}={saved.get(name)!r} but this dataset "
                f"reads source.{name}={source.get(name)!r}; the data read would differ. Pass "
                f"allow_source_change=True to resume anyway"
            )


def _check_relative_uri(uri: Any) -> None:
    """States written before URIs were made absolute may hold a path relative to a working
    directory that is unknown now: which table it meant cannot be told, so refuse."""
    if isinstance(uri, str) and uri and not has_scheme(uri) and not os.path.isabs(uri):
        raise ValueError(
            f"loader state was saved with the relative source.uri={uri!r} (written by an older "
            f"elastic-loader, relative to the working directory of that run); which table it meant "
            f"cannot be told. Pass allow_source_change=True to resume anyway if this dataset "
            f"reads that table"
        )


def check_cursors(state: dict[str, Any], num_splits: int, rows_per_split: int) -> list[int]:
    """The state's cursors, checked against this dataset's S and L (they may differ from the
    state's own plan when the source is allowed to change)."""
    cursors = state[KEY_CURSORS]
    _check_cursor_list(cursors, num_splits, rows_per_split)
    return list(cursors)
