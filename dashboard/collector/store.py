"""Events on disk: SQLite in WAL mode, one writer connection, one reader per thread.

Progress events (one per rank per second) become narrow `samples` rows plus a 10-second
`rollup`, so a whole hour of 64 ranks is drawn from ~23k rollup rows instead of 230k
samples; the rank's latest position goes to `ranks`. Discrete events (checkpoints, resumes,
epoch ends) are kept whole in `events`. WAL lets the dashboard read while ranks write, and
`synchronous=NORMAL` trades the last few events on power loss for ingest speed: telemetry
is lossy by design.

The queries that read them back are `reads.py`, this class's base.

Bounded: a run's S is fixed by its first event (a different one is a `RunConflict`, 409),
at most `new_runs_per_minute` runs start in any minute (`TooManyNewRuns`, 429: so a client
cannot flush real runs out of retention), every per-run read goes through an index, and
retention keeps the `keep_runs` most recently
active runs and drops runs silent for `keep_days` (checked when a run appears and at most
once a minute otherwise), and raw per-second samples only for a run's last 6 hours.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from dashboard.collector import receipt
from dashboard.collector.models import EventIn
from dashboard.collector.reads import Reads
from dashboard.collector.records import (
    Closed,
    Retention,
    RunConflict,
    TooManyNewRuns,
    conflict,
    is_replica,
)
from dashboard.collector.schema import ROLLUP_S, SCHEMA, TABLES, add_columns, connect
from dashboard.collector.writes import (
    EPOCH_ENDED,
    INSERT_EVENT,
    INSERT_SAMPLE,
    NEW_WORLD,
    PROCESS_EPOCH_ENDED,
    UPSERT_ATTEMPT,
    UPSERT_PROCESS,
    UPSERT_RANK,
    UPSERT_ROLLUP,
    UPSERT_RUN,
    UPSERT_SENDER,
    balance_skipped,
    run_row,
)
from loader.wire import (
    CACHE,
    CHECKPOINT_LOADED,
    CLOSED,
    EPOCH_END,
    MIXTURE_PROGRESS,
    PROGRESS,
)

PRUNE_EVERY_S = 60.0
__all__ = [
    "ROLLUP_S",
    "Closed",
    "Retention",
    "RunConflict",
    "Store",
    "TooManyNewRuns",
]


class Store(Reads):
    """The collector's only access to SQLite; methods return plain rows and dicts."""

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = str(path)
        self.retention = retention or Retention()
        self._created: deque[float] = deque()  # monotonic times of recent new runs
        self._pruned_at = 0.0
        self._write = connect(self.path)
        self._write.executescript(SCHEMA)
        add_columns(self._write)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []

    def _read(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.path)
            with self._lock:
                self._readers.append(conn)
        return conn

    def query(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return self._read().execute(sql, args).fetchall()

    def tuples(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Like `query`, as plain tuples: several times cheaper for tens of thousands of rows."""
        cursor = self._read().cursor()
        cursor.row_factory = None
        return cursor.execute(sql, args).fetchall()

    def ingest(self, events: Sequence[EventIn], now: float | None = None) -> int:
        """Store one batch in one transaction: all of it or (on error) none of it; returns
        how many events were stored (`duplicates`: the rest).

        Every event is stamped with `now`, its receipt on the collector's clock (the status
        rules judge silence from it). An event numbered (`seq`) at or below the highest
        number stored for its client is ignored: a retried or replayed batch changes nothing.
        Raises `RunConflict` (nothing stored) when an event's S differs from its run's.
        """
        arrived = time.time() if now is None else now
        with self._lock:
            fresh, senders = receipt.fresh(self._write, events)
            if not fresh:
                return 0
            new = self._store(fresh, senders, arrived)
        now = time.time() if now is None else now
        if new or now - self._pruned_at >= PRUNE_EVERY_S:
            self.prune(now)
        return len(fresh)

    def _store(
        self, events: list[EventIn], senders: dict[tuple[str, str], int], arrived: float
    ) -> int:
        """Write `events` (received at `arrived`) in one transaction (the caller holds the
        lock); how many runs they started."""
        received = receipt.received(self._write, events, arrived)
        runs: dict[str, dict[str, Any]] = {}
        worlds, ranks, ended, samples, rollup, discrete = [], [], [], [], [], []
        processes, process_ended, attempts = [], [], []
        for e, recv in zip(events, received, strict=True):
            if e.attempt is not None:
                reason = e.data.get("reason") if e.kind == CLOSED else None
                attempts.append(
                    (e.run_id, e.attempt, e.process, e.world_size, e.ts, e.ts, recv, recv,
                     reason if isinstance(reason, str) else None)
                )  # fmt: skip
            run = runs.get(e.run_id)
            if run is None:
                run = runs[e.run_id] = run_row(e)
            elif run["num_splits"] != e.num_splits:
                raise RunConflict(conflict(e.run_id, run["num_splits"], e.num_splits))
            run["last_ts"], run["events"] = max(run["last_ts"], e.ts), run["events"] + 1
            run["first_ts"] = min(run["first_ts"], e.ts)
            run["last_recv"] = max(run["last_recv"] or 0.0, recv)
            for key in ("total_epochs", "total_steps", "seq_len"):
                run[key] = getattr(e, key) if getattr(e, key) is not None else run[key]
            if e.kind == CHECKPOINT_LOADED:
                run["resumed_ts"] = e.ts
                worlds.append((e.world_size, e.ts, e.run_id, e.world_size, e.ts))
            if e.kind == EPOCH_END and e.epoch is not None:
                step = e.global_step if e.global_step is not None else e.step
                ended.append((e.epoch + 1, step, e.run_id, e.world_size, e.rank))
                process_ended.append((e.epoch + 1, step, e.run_id, e.world_size, e.process))
            if e.kind != PROGRESS:
                data = orjson.dumps(e.data)
                said = (e.run_id, e.ts, e.kind, e.rank, e.world_size)
                discrete.append((*said, e.epoch, e.step, data, e.global_step, e.process, recv))
                continue
            lo, hi = e.splits if e.splits else (None, None)
            cursors = orjson.dumps(e.cursors) if e.cursors is not None else None
            where = (e.run_id, e.world_size, e.rank, e.ts, e.host, e.local_rank, e.num_workers)
            position = (e.epoch, e.step, lo, hi, cursors, e.rows_per_s, e.global_step)
            packed = (e.tokens, e.blocks_per_split)
            offset = None if e.sent_ts is None else arrived - e.sent_ts  # collector - rank clock
            mesh = orjson.dumps(e.mesh) if e.mesh is not None else None
            processes.append(
                (e.run_id, e.world_size, e.process, e.rank, mesh, e.host, e.ts,
                 e.interval_s or None, e.epoch, e.step, e.global_step, e.ts, e.heartbeat_s, offset,
                 recv, recv, e.seq)
            )  # fmt: skip
            last = (e.ts, e.global_batch_size, balance_skipped(e))
            ranks.append((*where, *position, e.interval_s or None, *packed, *last))
            if is_replica(e):
                continue  # its rows are the rows its data-parallel rank's first process counted
            tokens = e.rows * e.seq_len if e.seq_len is not None else None  # rows are blocks
            row = (e.rows, e.batches, e.wait_s, e.interval_s, tokens)
            samples.append((e.run_id, e.rank, e.ts, e.step, *row))
            rollup.append((e.run_id, e.rank, int(e.ts // ROLLUP_S), *row))
        conn = self._write
        conn.execute("BEGIN")
        try:
            new = self._check_runs(conn, runs)
            self._count_new_runs(new)
            conn.executemany(UPSERT_RUN, list(runs.values()))
            conn.executemany(NEW_WORLD, worlds)
            conn.executemany(UPSERT_RANK, ranks)
            conn.executemany(UPSERT_PROCESS, processes)
            conn.executemany(EPOCH_ENDED, ended)  # after the ranks: they may be new
            conn.executemany(PROCESS_EPOCH_ENDED, process_ended)
            conn.executemany(INSERT_SAMPLE, samples)
            conn.executemany(UPSERT_ROLLUP, rollup)
            conn.executemany(INSERT_EVENT, discrete)
            conn.executemany(UPSERT_SENDER, [(*k, seq) for k, seq in senders.items()])
            conn.executemany(UPSERT_ATTEMPT, attempts)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return new

    @staticmethod
    def _check_runs(conn: sqlite3.Connection, runs: dict[str, dict[str, Any]]) -> int:
        """Refuse events whose S is not their run's; how many runs the batch starts."""
        marks = ",".join("?" * len(runs))
        sql = f"SELECT run_id, num_splits FROM runs WHERE run_id IN ({marks})"
        known = dict(conn.execute(sql, list(runs)).fetchall())
        for run_id, num_splits in known.items():
            if num_splits != runs[run_id]["num_splits"]:
                raise RunConflict(conflict(run_id, num_splits, runs[run_id]["num_splits"]))
        return len(runs) - len(known)

    def _count_new_runs(self, new: int) -> None:
        """Allow `new` more runs if the last minute's stay within `new_runs_per_minute`."""
        if not new:
            return
        now = time.monotonic()
        while self._created and self._created[0] < now - 60:
            self._created.popleft()
        limit = self.retention.new_runs_per_minute
        if len(self._created) + new > limit:
            raise TooManyNewRuns(
                f"more than {limit} new runs in a minute: retry later, "
                "or raise the limit (Settings.new_runs_per_minute)"
            )
        self._created.extend([now] * new)

    def prune(self, now: float) -> int:
        """Apply retention (see `Retention`); returns how many runs were dropped."""
        keep = self.retention
        with self._lock:
            self._pruned_at = now
            conn = self._write
            victims = [
                (row[0],)
                for row in conn.execute(
                    "SELECT run_id FROM runs WHERE last_ts < ? UNION "
                    "SELECT run_id FROM (SELECT run_id FROM runs ORDER BY last_ts DESC "
                    "LIMIT -1 OFFSET ?)",
                    (now - keep.keep_days * 86400, keep.keep_runs),
                )
            ]
            conn.execute("BEGIN")
            try:
                for table in TABLES:
                    conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", victims)
                conn.execute(
                    "DELETE FROM samples WHERE rowid IN (SELECT s.rowid FROM runs r "
                    "JOIN samples s ON s.run_id = r.run_id AND s.ts < r.last_ts - ?)",
                    (keep.keep_samples_s,),
                )
                for live in (MIXTURE_PROGRESS, CACHE):  # live reports: the latest ones kept
                    conn.execute(
                        "DELETE FROM events WHERE id IN (SELECT id FROM (SELECT id, row_number() "
                        "OVER (PARTITION BY run_id ORDER BY ts DESC, id DESC) AS newer FROM events "
                        "WHERE kind = ?) WHERE newer > ?)",
                        (live, keep.keep_live_reports),
                    )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return len(victims)

    def close(self) -> None:
        with self._lock:
            for conn in [self._write, *self._readers]:
                conn.close()
            self._readers.clear()
