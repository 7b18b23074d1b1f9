"""Events on disk: SQLite in WAL mode, one writer connection, one reader per thread.

Progress events (one per rank per second) become narrow `samples` rows plus a 10-second
`rollup`, so a whole hour of 64 ranks is drawn from ~23k rollup rows instead of 230k
samples; the rank's latest position goes to `ranks`. Discrete events (checkpoints, resumes,
epoch ends) are kept whole in `events`. WAL lets the dashboard read while ranks write, and
`synchronous=NORMAL` trades the last few events on power loss for ingest speed: telemetry
is lossy by design.

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
from dashboard.collector.records import (
    Closed,
    Retention,
    RunConflict,
    TooManyNewRuns,
    conflict,
    is_replica,
)
from dashboard.collector.schema import SCHEMA, TABLES, add_columns, connect
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
    CHECKPOINT_SAVED,
    CLOSED,
    EPOCH_END,
    MIXTURE,
    MIXTURE_PROGRESS,
    PROGRESS,
)

ROLLUP_S = 10
PRUNE_EVERY_S = 60.0
RUN_COLUMNS = """r.*, (SELECT count(*) FROM ranks k WHERE k.run_id = r.run_id
  AND k.world_size = r.world_size) AS ranks"""


class Store:
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

    def count(self) -> int:
        """Events stored: every progress sample plus every discrete event."""
        row = self.query("SELECT (SELECT count(*) FROM samples) + (SELECT count(*) FROM events)")
        return int(row[0][0])

    def runs(self) -> list[dict[str, Any]]:
        rows = self.query(f"SELECT {RUN_COLUMNS} FROM runs r ORDER BY last_ts DESC")
        return [dict(row) for row in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run by its primary key: the cost does not grow with the number of runs."""
        rows = self.query(f"SELECT {RUN_COLUMNS} FROM runs r WHERE run_id = ?", run_id)
        return dict(rows[0]) if rows else None

    def ranks(self, run_id: str, world_size: int) -> list[dict[str, Any]]:
        rows = self.query(
            "SELECT * FROM ranks WHERE run_id = ? AND world_size = ? ORDER BY rank",
            run_id,
            world_size,
        )
        out = []
        for row in rows:
            rank = dict(row)
            for key in ("run_id", "lo", "hi"):
                del rank[key]
            rank["splits"] = [row["lo"], row["hi"]] if row["lo"] is not None else []
            rank["cursors"] = orjson.loads(row["cursors"]) if row["cursors"] else None
            out.append(rank)
        return out

    def series(self, run_id: str, since: float, bucket_s: int) -> list[tuple[Any, ...]]:
        """Per rank and time bucket: (rank, t, rows, batches, wait_s, interval_s), summed.

        Buckets of at least `ROLLUP_S` read the rollup (10× fewer rows); finer ones the
        samples, which a live view only asks for over the last minutes.
        """
        sums = "sum(rows) AS rows, sum(batches) AS batches, sum(wait_s) AS wait_s, "
        sums += "sum(interval_s) AS interval_s"
        if bucket_s == ROLLUP_S:  # rollup rows as they are: no GROUP BY to pay for
            return self.tuples(
                "SELECT rank, bucket * ? AS t, rows, batches, wait_s, interval_s FROM rollup "
                "WHERE run_id = ? AND bucket >= ?",
                ROLLUP_S,
                run_id,
                int(since // ROLLUP_S),
            )
        if bucket_s >= ROLLUP_S:
            k = bucket_s // ROLLUP_S
            return self.tuples(
                f"SELECT rank, (bucket / ?) * ? AS t, {sums} FROM rollup "
                "WHERE run_id = ? AND bucket >= ? GROUP BY t, rank ORDER BY t, rank",
                k,
                k * ROLLUP_S,
                run_id,
                int(since // ROLLUP_S),
            )
        return self.tuples(
            f"SELECT rank, CAST(ts / ? AS INTEGER) * ? AS t, {sums} FROM samples "
            "WHERE run_id = ? AND ts >= ? GROUP BY t, rank ORDER BY t, rank",
            bucket_s,
            bucket_s,
            run_id,
            since,
        )

    def events(self, run_id: str, kind: str | None, limit: int) -> list[dict[str, Any]]:
        sql = "SELECT kind, ts, rank, world_size, epoch, step, global_step, data FROM events "
        sql += "WHERE run_id = ?"
        args: list[Any] = [run_id]
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        rows = self.query(sql + " ORDER BY ts DESC LIMIT ?", *args, limit)
        return [{**dict(row), "data": orjson.loads(row["data"])} for row in reversed(rows)]

    def latest_mixture(self, run_id: str) -> dict[str, Any] | None:
        """A mixture run's latest facts: its last `mixture` or live `mixture_progress` event
        (by global step, then time) whose data names the datasets; None for other runs."""
        found = [e for kind in (MIXTURE, MIXTURE_PROGRESS) for e in self.events(run_id, kind, 1)]
        found = [e for e in found if isinstance(e["data"], dict) and e["data"].get("names")]
        return max(found, key=lambda e: (e["global_step"] or 0, e["ts"]), default=None)

    def closed_ranks(self, run_id: str, world_size: int, since: float) -> dict[int, Closed]:
        """Process (global rank) → its latest `closed` event (sent by `close()`, at exit and on
        SIGTERM) received at or after `since` (collector's clock; events stored before
        receipts were kept: sent then), read through the `events_closed` index."""
        rows = self.query(
            "SELECT rank, coalesce(process, rank) AS process, ts, data, "
            "max(coalesce(recv_ts, ts)) AS recv FROM events "
            "WHERE run_id = ? AND kind = ? AND world_size = ? "
            "AND (recv_ts >= ? OR recv_ts IS NULL AND ts >= ?) GROUP BY 2",
            run_id,
            CLOSED,
            world_size,
            since,
            since,
        )
        return {
            int(r["process"]): Closed.of(r["ts"], r["data"], r["rank"], r["recv"]) for r in rows
        }

    def closed_between(self, run_id: str, since: float, until: float) -> list[Closed]:
        """The `closed` events of any world in [since, until): who closed before a resume."""
        rows = self.query(
            "SELECT rank, ts, data FROM events WHERE run_id = ? AND ts >= ? AND ts < ? "
            "AND kind = ?",
            run_id,
            since,
            until,
            CLOSED,
        )
        return [Closed.of(row["ts"], row["data"], row["rank"]) for row in rows]

    def last_active(self, run_id: str, until: float) -> sqlite3.Row | None:
        """The latest sample before `until` in which a rank handed out batches (the index
        on (run_id, ts) read backwards: it stops at the first match)."""
        rows = self.query(
            "SELECT ts, rank FROM samples WHERE run_id = ? AND ts < ? AND batches > 0 "
            "ORDER BY ts DESC LIMIT 1",
            run_id,
            until,
        )
        return rows[0] if rows else None

    def rank_totals(self, run_id: str, since: float, world_size: int) -> list[sqlite3.Row]:
        """Per rank of the world: rows, tokens (packed data, else NULL), wait and covered
        seconds summed over the rollup buckets from the one holding `since` (10x fewer rows
        than the samples)."""
        return self.query(
            "SELECT rank, sum(rows) AS rows, sum(tokens) AS tokens, sum(wait_s) AS wait_s, "
            "sum(interval_s) AS iv "
            "FROM rollup WHERE run_id = ? AND bucket >= ? AND rank < ? GROUP BY rank "
            "ORDER BY rank",
            run_id,
            int(since // ROLLUP_S),
            world_size,
        )

    def heartbeats(self, run_id: str, world_size: int) -> list[dict[str, Any]]:
        """Each process's last report: its data-parallel rank, global rank (`process`) and
        mesh coordinates, when, its send intervals and position (no cursors)."""
        rows = self.query(
            "SELECT * FROM processes WHERE run_id = ? AND world_size = ? ORDER BY process",
            run_id,
            world_size,
        )
        out = []
        for row in rows:
            p = dict(row)
            p["mesh"] = orjson.loads(row["mesh"]) if row["mesh"] else None
            out.append(p)
        return out

    def epoch_read(self, run_id: str, world_size: int, num_splits: int) -> tuple[int, float]:
        """(the epoch the world's ranks stand in, the share of it read: every split's largest
        reported cursor over what a cursor counts up to), from the ranks' last positions."""
        rows = self.query(
            "SELECT epoch, lo, hi, cursors, blocks_per_split, rows_per_split FROM ranks k "
            "JOIN runs r USING (run_id) WHERE run_id = ? AND k.world_size = ?",
            run_id,
            world_size,
        )
        if not rows:
            return 0, 0.0
        epoch = max(row["epoch"] or 0 for row in rows)
        cursors = [0] * num_splits
        per_split = 0
        for row in rows:
            if (row["epoch"] or 0) != epoch or not row["cursors"] or row["lo"] is None:
                continue
            per_split = max(per_split, row["blocks_per_split"] or row["rows_per_split"] or 0)
            for split, c in zip(
                range(row["lo"], row["hi"]), orjson.loads(row["cursors"]), strict=False
            ):
                cursors[split] = max(cursors[split], c)
        return epoch, (sum(cursors) / (num_splits * per_split) if per_split else 0.0)

    def checkpoints_saved(self, run_id: str) -> int:
        """Checkpoints saved in the run, folded across ranks (one per step and world size)."""
        rows = self.query(
            "SELECT count(*) FROM (SELECT DISTINCT coalesce(global_step, step), world_size "
            "FROM events WHERE run_id = ? AND kind = ?)",
            run_id,
            CHECKPOINT_SAVED,
        )
        return int(rows[0][0])

    def milestones(self, run_id: str, limit: int = 10_000) -> list[dict[str, Any]]:
        """Discrete events but `closed` and live mixture and node-cache reports, folded across ranks: one row per kind, epoch, step
        (global when sent) and world size, with the data of its first event and the count
        of ranks that sent it (SQLite takes the bare `data` from the `min(ts)` row)."""
        rows = self.query(
            "SELECT kind, min(ts) AS ts, epoch, coalesce(global_step, step) AS step, world_size, "
            "data, count(DISTINCT rank) AS ranks FROM events WHERE run_id = ? AND kind != ? "
            "AND kind != ? AND kind != ? GROUP BY kind, epoch, 4, world_size ORDER BY ts LIMIT ?",
            run_id,
            CLOSED,
            MIXTURE_PROGRESS,
            CACHE,
            limit,
        )
        return [{**dict(row), "data": orjson.loads(row["data"])} for row in rows]

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's attempts (a launcher's job or restart: a crash and its resume are two), in
        the order they began (by receipt): when each reported first and last, its world
        size, processes, and how many closed by each reason (`silent`: no `closed`, killed
        or crashed unless the attempt is still going)."""
        rows = self.query(
            "SELECT attempt, min(first_ts) AS first_ts, max(last_ts) AS last_ts, "
            "max(world_size) AS world_size, count(*) AS processes, min(first_recv) AS f, "
            "json_group_array(coalesce(reason, 'silent')) AS reasons "
            "FROM attempts WHERE run_id = ? GROUP BY attempt ORDER BY f, attempt",
            run_id,
        )
        out = []
        for row in rows:
            ended: dict[str, int] = {}
            for reason in orjson.loads(row["reasons"]):
                ended[reason] = ended.get(reason, 0) + 1
            attempt = {k: row[k] for k in ("attempt", "first_ts", "last_ts", "world_size")}
            out.append({**attempt, "processes": row["processes"], "ended": ended})
        return out

    def reporting_buckets(self, run_id: str) -> list[int]:
        """Rollup buckets (`ROLLUP_S` s) in which any rank reported: the gaps are outages."""
        rows = self.query("SELECT DISTINCT bucket FROM rollup WHERE run_id = ?", run_id)
        return sorted(int(row[0]) for row in rows)

    def close(self) -> None:
        with self._lock:
            for conn in [self._write, *self._readers]:
                conn.close()
            self._readers.clear()
