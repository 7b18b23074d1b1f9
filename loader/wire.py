"""The telemetry wire format's names, defined once for the client and the collector.

Standard library only: `loader/telemetry/client.py` sends with these names and
`dashboard/collector` validates and stores with them, so the two cannot drift apart, and the
loader never imports the dashboard.
"""

from __future__ import annotations

import re

# Where ranks POST `{"events": [...]}`, relative to the collector's URL.
INGEST_PATH = "/api/events"

# A run id is one URL path segment: 1-128 printable characters without '/'.
RUN_ID_PATTERN = r"^[^/\x00-\x1f\x7f]{1,128}$"
RUN_ID = re.compile(RUN_ID_PATTERN)

# Any event kind: lower-case identifier (the collector refuses anything else).
KIND_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"

# The kinds the loader sends. `progress` is the ~1 s heartbeat with the interval's counters;
# the others are discrete events kept whole.
PROGRESS = "progress"
# A progress event's `data` key: units (rows; blocks when packed) of the rank's epoch that no
# rank reads on this world size, so every rank gets the same count (the state's `skipped`).
# Sent only when nonzero, in `data` so that a collector older than it accepts the event.
BALANCE_SKIPPED = "skipped"
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_LOADED = "checkpoint_loaded"
EPOCH_END = "epoch_end"
# A node cache's totals (`data`: host, cache_dir, hits, misses, bytes_from_store, ...).
CACHE = "cache"
STEPS_SKIPPED = "steps_skipped"  # a range of global steps the loader jumps over
# A mixture's weights and per-dataset progress: at each `for` and each resume (where weights
# may change). `data`: names, weights (text), phase_start, supplied/passes/tokens per dataset.
MIXTURE = "mixture"
# The same data, live: rank 0 of a mixture every few heartbeats while batches flow (the
# Progress and Placement pages read the latest; not a Timeline milestone).
MIXTURE_PROGRESS = "mixture_progress"
# The client's last event: `data = {"reason": CLOSE_REASON_*}` and, for an error, `"error"`
# (the exception's type name, never its message: messages can carry secrets).
# A rank that stops sending heartbeats without one crashed (or was killed).
CLOSED = "closed"
CLOSE_REASON_CLOSE = "close"  # `close()`, or its loader was garbage-collected
CLOSE_REASON_EXIT = "exit"  # normal exit (atexit, or the end of a multiprocessing child)
CLOSE_REASON_ERROR = "error"  # ending on an uncaught exception (or SystemExit with a code != 0)
# Ended by a signal (SIGTERM, SIGINT: a launcher stopping the job after another process died,
# a preemption, or an elastic agent restarting its workers): `data.signal` names it, and
# `data.restart` is true when a torchrun agent has restarts left (a planned restart).
CLOSE_REASON_TERMINATED = "terminated"

# Sane bounds both sides agree on: a run has at most this many splits (and so a rank at
# most this many cursors), which keeps one event and every per-split view bounded.
MAX_SPLITS = 1 << 20
MAX_WORLD_SIZE = 1 << 20

# A mixture's dataset names travel as a list of texts in `mixture` events (never joined: a
# name may hold a comma): each 1-256 characters, at most 4,096 datasets, so one event always
# fits the collector's limits; `MixedDataset` refuses other names when it is built.
MAX_NAME_CHARS = 256
MAX_TEXT = 4096  # the longest text value of an event's `data` (a checkpoint's path, ...)
MAX_MIXTURE_DATASETS = 4096
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,256}$"
NAME = re.compile(NAME_PATTERN)


def text_list(data: object, key: str) -> list[str]:
    """A list of texts of a `mixture` event's `data` (`names`, `weights`): sent as a list;
    events from loaders before it joined them with commas, split here."""
    value = data.get(key) if isinstance(data, dict) else None
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value).split(",") if value else []
