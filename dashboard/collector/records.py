"""What the store hands out and refuses, apart from how it reads and writes SQLite
(`store.py`): its retention, a `closed` event as the status rules read it, which events
are a data-parallel rank's replicas, and the errors an ingest raises."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from dashboard.collector.models import EventIn

__all__ = [
    "DATA_DIMS",
    "Closed",
    "Retention",
    "RunConflict",
    "TooManyNewRuns",
    "conflict",
    "is_replica",
]

# Mesh dims that split the data (the loader's defaults, issue 26): a process whose other
# coordinates are not all 0 is a replica of its data-parallel rank, and its rows are the
# rows its first replica already counted.
DATA_DIMS = frozenset({"dp", "dp_replicate", "dp_shard", "batch", "data"})


@dataclass(frozen=True)
class Retention:
    """What the store keeps: the `keep_runs` most recently active runs, none silent for
    `keep_days`; per run, raw `samples` only for the last `keep_samples_s` before its last
    report (older seconds stay in the 10 s `rollup`, which is all a throughput window longer
    than `ROLLUP_S * MAX_POINTS` = 20,000 s reads), and its latest `keep_live_reports` live
    mixture reports (each supersedes the ones before; a month-long mixture run sends
    ~500,000). At most `new_runs_per_minute` new runs."""

    keep_runs: int = 100
    keep_days: float = 30.0
    keep_samples_s: float = 6 * 3600.0
    new_runs_per_minute: int = 60
    keep_live_reports: int = 1000


@dataclass(frozen=True)
class Closed:
    """A rank's `closed` event: when, why (`loader/wire.py`'s reasons) and, for an error,
    the exception's type."""

    ts: float
    reason: str | None
    error: str | None = None
    rank: int = -1
    restart: bool = False  # `terminated` by an elastic agent that has restarts left
    recv: float | None = None  # when the collector received it (None: stored before that)

    @classmethod
    def of(cls, ts: float, data: bytes, rank: int = -1, recv: float | None = None) -> Closed:
        said = orjson.loads(data) if data else {}
        reason, error = said.get("reason"), said.get("error")
        return cls(
            float(ts),
            reason if isinstance(reason, str) else None,
            error if isinstance(error, str) else None,
            int(rank),
            said.get("restart") is True,
            None if recv is None else float(recv),
        )


def is_replica(e: EventIn) -> bool:
    """Does `e` come from a replica (not the first process) of its data-parallel rank?"""
    return bool(e.mesh) and any(v for k, v in (e.mesh or {}).items() if k not in DATA_DIMS)


class RunConflict(ValueError):
    """An event contradicts what its run already is (e.g. another number of splits)."""


class TooManyNewRuns(ValueError):
    """More new runs in the last minute than allowed: retention must not be flushed by spam."""


def conflict(run_id: str, num_splits: int, got: int) -> str:
    return (
        f"run {run_id!r} has num_splits={num_splits}, this event says {got}: a run's S "
        "cannot change; give the new layout its own run id (ELASTIC_LOADER_RUN_ID)"
    )
