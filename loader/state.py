"""The loader state: its keys, how it is built, and how a loaded one is checked.

The state is per split, never per rank: `{epoch, cursors[S]}` plus what identifies the
plan and the source. It means the same on any world size that divides S.
"""

from __future__ import annotations

import os
from typing import Any

FORMAT = "elastic-loader/state"
FORMAT_VERSION = 1

KEY_FORMAT = "format"
KEY_FORMAT_VERSION = "format_version"
KEY_PLAN = "plan"
KEY_SOURCE = "source"
KEY_EPOCH = "epoch"
KEY_CURSORS = "cursors"
KEY_SKIPPED = "skipped"
KEY_WORLD_SIZE = "world_size"
KEY_STEP = "step"

# Source fields that must match for a resume to read the same rows. The version is not
# here: a resume reopens the table at the state's version instead of comparing it; the
# `version_id` of that version (a Lance content identity) must then match. States written
# before `version_id` existed lack it and skip that one comparison.
SOURCE_IDENTITY = ("kind", "uri", "table", "columns", "fingerprint", "version_id")
OPTIONAL_SOURCE_FIELDS = ("version_id",)


def make_state(
    plan: dict[str, Any],
    source: dict[str, Any],
    epoch: int,
    cursors: list[int],
    skipped: int,
    world_size: int,
    step: int,
) -> dict[str, Any]:
    return {
        KEY_FORMAT: FORMAT,
        KEY_FORMAT_VERSION: FORMAT_VERSION,
        KEY_PLAN: dict(plan),
        KEY_SOURCE: dict(source),
        KEY_EPOCH: int(epoch),
        KEY_CURSORS: [int(c) for c in cursors],
        KEY_SKIPPED: int(skipped),
        KEY_WORLD_SIZE: int(world_size),
        KEY_STEP: int(step),
    }


def check_header(state: Any) -> None:
    """A dict of this format and a version we can read, else ValueError saying which."""
    if not isinstance(state, dict):
        raise ValueError(f"loader state must be a dict, got {type(state).__name__}")
    missing = [
        k for k in (KEY_FORMAT, KEY_PLAN, KEY_SOURCE, KEY_EPOCH, KEY_CURSORS) if k not in state
    ]
    if missing:
        raise ValueError(
            f"loader state is missing fields {missing}; is it an elastic-loader state?"
        )
    if state[KEY_FORMAT] != FORMAT:
        raise ValueError(f"loader state has format {state[KEY_FORMAT]!r}, expected {FORMAT!r}")
    version = state.get(KEY_FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"loader state has format_version {version!r}; this elastic-loader reads up to "
            f"{FORMAT_VERSION}: upgrade elastic-loader to resume from it"
        )


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
    if isinstance(uri, str) and uri and "://" not in uri and not os.path.isabs(uri):
        raise ValueError(
            f"loader state was saved with the relative source.uri={uri!r} (written by an older "
            f"elastic-loader, relative to the working directory of that run); which table it meant "
            f"cannot be told. Pass allow_source_change=True to resume anyway if this dataset "
            f"reads that table"
        )


def check_cursors(state: dict[str, Any], num_splits: int, rows_per_split: int) -> list[int]:
    cursors = state[KEY_CURSORS]
    if not isinstance(cursors, list) or len(cursors) != num_splits:
        got = len(cursors) if isinstance(cursors, list) else type(cursors).__name__
        raise ValueError(f"loader state has {got} cursors, expected num_splits={num_splits}")
    for split, cursor in enumerate(cursors):
        if not isinstance(cursor, int) or not 0 <= cursor <= rows_per_split:
            raise ValueError(
                f"loader state cursor of split {split} is {cursor!r}, outside [0, {rows_per_split}]"
            )
    epoch = state[KEY_EPOCH]
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"loader state epoch is {epoch!r}, expected an integer >= 0")
    return list(cursors)
