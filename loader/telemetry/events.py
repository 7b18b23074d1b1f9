"""What a telemetry event carries: the rank's static facts, its position, and plain values.

Kept apart from the client so the shape of an event (which the collector's models validate)
is read in one place, without the threads and sockets that send it. Everything here is a
pure function of what the loader passed: no I/O, no state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from loader.wire import BALANCE_SKIPPED, MAX_TEXT

STATIC_KEYS = (
    "host",
    "rank",
    "local_rank",
    "world_size",
    "num_workers",
    "num_splits",
    "rows_per_split",
    "batch_size",
    "global_batch_size",
    "total_epochs",
    "total_steps",
    "seq_len",
    "heartbeat_s",
    "global_rank",
    "mesh",
)
# Fields of `event(kind, **fields)` that describe the position and go to the top level.
# Packed data only: `tokens` (handed out this epoch by the rank) and `blocks_per_split` (what
# a cursor counts up to this epoch: blocks, not the L documents of `rows_per_split`).
POSITION_KEYS = (  # G and the batch size too: a batch_schedule changes them, and the splits
    "epoch", "step", "global_step", "splits", "cursors", "tokens", "blocks_per_split",
    "global_batch_size", "batch_size",
)  # fmt: skip


def event_value(value: Any) -> Any:
    """A JSON scalar, list of ints or list of texts, whatever the loader passed (numpy ints, Paths, ...)."""
    if isinstance(value, str):
        return _fits(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, os.PathLike):
        return _fits(os.fspath(value))
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        value = tolist()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
    if isinstance(value, (list, tuple, range)) and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)  # a mixture's names and weights
    return str(value)


def _fits(text: str) -> str:
    """A text the collector accepts: at most `wire.MAX_TEXT` characters (a path longer than
    that keeps its end, the part that names the file)."""
    return text if len(text) <= MAX_TEXT else "…" + text[-(MAX_TEXT - 1) :]


def position_fields(snapshot: Mapping[str, Any], num_splits: int | None) -> dict[str, Any]:
    """Epoch, step, owned splits and *their* cursors, whatever length the loader gave."""
    out: dict[str, Any] = {k: snapshot[k] for k in POSITION_KEYS if snapshot.get(k) is not None}
    for key in ("epoch", "step", "global_step"):
        if key in out:
            out[key] = int(out[key])
    splits, cursors = out.get("splits"), out.get("cursors")
    if splits is not None:
        lo, hi = int(splits[0]), int(splits[1])
        out["splits"] = [lo, hi]
        if cursors is not None and len(cursors) == num_splits and hi - lo != num_splits:
            out["cursors"] = [int(c) for c in cursors[lo:hi]]
    if out.get("cursors") is not None:
        out["cursors"] = [int(c) for c in out["cursors"]]
    return out


def progress_fields(snapshot: Mapping[str, Any], num_splits: int | None) -> dict[str, Any]:
    """What a `progress` event says of the loader: its position and, in `data`, the units
    skipped for balance this epoch when there are any (`wire.BALANCE_SKIPPED`)."""
    out = position_fields(snapshot, num_splits)
    skipped = snapshot.get(BALANCE_SKIPPED)
    if skipped:
        out["data"] = {BALANCE_SKIPPED: int(skipped)}
    return out
