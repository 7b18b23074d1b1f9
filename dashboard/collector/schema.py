"""The collector's database: its tables, the columns added since, and how it is opened.

Kept apart from `store.py` and `reads.py` (which write and read events) so the schema is read in one
place; SQL still lives in the collector's store package and nowhere else.
"""

from __future__ import annotations

import sqlite3

ROLLUP_S = 10  # seconds per `rollup` bucket
TABLES = (
    "runs", "ranks", "samples", "rollup", "events", "processes", "senders", "attempts",
)  # fmt: skip

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, first_ts REAL, last_ts REAL, num_splits INTEGER,
  rows_per_split INTEGER, batch_size INTEGER, world_size INTEGER, world_since REAL,
  prev_world_size INTEGER, events INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS ranks (
  run_id TEXT, world_size INTEGER, rank INTEGER, ts REAL, host TEXT, local_rank INTEGER,
  num_workers INTEGER, epoch INTEGER, step INTEGER, lo INTEGER, hi INTEGER, cursors BLOB,
  rows_per_s REAL, PRIMARY KEY (run_id, world_size, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samples (
  run_id TEXT, rank INTEGER, ts REAL, step INTEGER, rows INTEGER, batches INTEGER,
  wait_s REAL, interval_s REAL);
CREATE INDEX IF NOT EXISTS samples_run_ts ON samples (run_id, ts);
CREATE TABLE IF NOT EXISTS rollup (
  run_id TEXT, rank INTEGER, bucket INTEGER, rows INTEGER, batches INTEGER, wait_s REAL,
  interval_s REAL, PRIMARY KEY (run_id, bucket, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, run_id TEXT, ts REAL, kind TEXT, rank INTEGER, world_size INTEGER,
  epoch INTEGER, step INTEGER, data BLOB);
CREATE INDEX IF NOT EXISTS events_run_ts ON events (run_id, ts);
CREATE INDEX IF NOT EXISTS runs_last_ts ON runs (last_ts);
CREATE TABLE IF NOT EXISTS processes (
  run_id TEXT, world_size INTEGER, process INTEGER, rank INTEGER, mesh BLOB, host TEXT,
  ts REAL, interval_s REAL, prev_interval_s REAL, epoch INTEGER, step INTEGER,
  global_step INTEGER, step_ts REAL, moved_s REAL, epochs_done INTEGER, end_step INTEGER,
  heartbeat_s REAL, clock_offset REAL, PRIMARY KEY (run_id, world_size, process)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS senders (
  run_id TEXT, incarnation TEXT, seq INTEGER, PRIMARY KEY (run_id, incarnation)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS attempts (
  run_id TEXT, attempt TEXT, process INTEGER, world_size INTEGER, first_ts REAL, last_ts REAL,
  first_recv REAL, last_recv REAL, reason TEXT,
  PRIMARY KEY (run_id, attempt, process)) WITHOUT ROWID;
"""
# `attempts`: per launcher attempt of a run (a crash and its resume are two) and process, when
# it reported first and last, and how its `closed` said it ended (NULL: no `closed` came).
# `senders`: per telemetry client (its `incarnation`, random, one per client object: a
# restarted process is a new one) the highest event number stored; a repeated or older
# number is ignored (events are idempotent).
# `processes`: one row per process (its global rank): what the status rules judge. `ranks`
# keeps one per data-parallel rank (the position its replicas share) for placement and
# progress, so a mesh's replicas are counted as processes and never folded into one.
# Columns added after the first release: ALTERed into older databases on open, so a
# collector upgrade keeps the runs it already has.
ADDED_COLUMNS = (
    ("runs", "total_epochs", "INTEGER"),
    ("runs", "total_steps", "INTEGER"),
    ("ranks", "global_step", "INTEGER"),
    ("ranks", "interval_s", "REAL"),
    ("events", "global_step", "INTEGER"),
    # packed data: tokens per block; the rank's tokens this epoch and blocks per split; the
    # tokens handed out in a sample / rollup bucket (NULL for row data)
    ("runs", "seq_len", "INTEGER"),
    ("ranks", "tokens", "INTEGER"),
    ("ranks", "blocks_per_split", "INTEGER"),
    ("samples", "tokens", "INTEGER"),
    ("rollup", "tokens", "INTEGER"),
    # run health: when the rank's position last moved, its interval before the last (a
    # single long gap must not stretch the thresholds), the epochs it reported ended and the
    # step it stood at then; the run's latest resume (on any W)
    ("ranks", "step_ts", "REAL"),
    ("ranks", "prev_interval_s", "REAL"),
    ("ranks", "epochs_done", "INTEGER"),
    ("ranks", "end_step", "INTEGER"),
    ("runs", "resumed_ts", "REAL"),
    # the global batch G the rank reads with: with the split count, who reads which part of
    # a split that ranks share (loader.layout); NULL from clients older than it
    ("ranks", "global_batch_size", "INTEGER"),
    ("events", "process", "INTEGER"),  # the global rank of the process that sent it
    # liveness on the collector's clock (issue 33): when the collector received a run's,
    # a process's, an event's latest report, and when it received the process's last step
    # move; the sender's `seq` of a process's latest report
    ("runs", "last_recv", "REAL"),
    ("processes", "recv_ts", "REAL"),
    ("processes", "step_recv", "REAL"),
    ("processes", "seq", "INTEGER"),
    ("events", "recv_ts", "REAL"),
    # units of the rank's epoch no rank reads on its W (balance; `wire.BALANCE_SKIPPED` in
    # a progress event's data): NULL when none, or from clients older than it
    ("ranks", "skipped", "INTEGER"),
)
# made after ADDED_COLUMNS (an older database gets `recv_ts` first): a process's latest
# `closed` by receipt without reading the run's other events
INDEXES = "CREATE INDEX IF NOT EXISTS events_closed ON events (run_id, kind, recv_ts)"


def connect(path: str) -> sqlite3.Connection:
    """WAL, so the dashboard reads while ranks write; NORMAL sync: telemetry is lossy."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def add_columns(conn: sqlite3.Connection) -> None:
    """ALTER the columns of ADDED_COLUMNS into a database made before them."""
    for table, column, kind in ADDED_COLUMNS:
        have = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    conn.execute(INDEXES)
