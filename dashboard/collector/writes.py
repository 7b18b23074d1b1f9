"""The statements `Store.ingest` writes with, and the `runs` row a batch starts.

Kept apart from `store.py` (which runs them in one transaction and answers the reads) so
each stays short; every statement is keyed by the tables' primary keys.
"""

from __future__ import annotations

from typing import Any

from dashboard.collector.models import EventIn
from loader.wire import BALANCE_SKIPPED

UPSERT_RUN = """
INSERT INTO runs (run_id, first_ts, last_ts, num_splits, rows_per_split, batch_size,
  world_size, world_since, events, total_epochs, total_steps, seq_len, resumed_ts, last_recv)
  VALUES (:run_id, :first_ts, :last_ts, :num_splits, :rows_per_split, :batch_size,
  :world_size, :first_ts, :events, :total_epochs, :total_steps, :seq_len, :resumed_ts,
  :last_recv)
ON CONFLICT (run_id) DO UPDATE SET first_ts = min(first_ts, excluded.first_ts),
  total_epochs = coalesce(excluded.total_epochs, total_epochs),
  total_steps = coalesce(excluded.total_steps, total_steps),
  seq_len = coalesce(excluded.seq_len, seq_len),
  resumed_ts = coalesce(max(resumed_ts, excluded.resumed_ts), resumed_ts, excluded.resumed_ts),
  last_ts = max(last_ts, excluded.last_ts), num_splits = excluded.num_splits,
  last_recv = max(coalesce(last_recv, 0), excluded.last_recv),
  rows_per_split = excluded.rows_per_split,
  batch_size = coalesce(excluded.batch_size, batch_size), events = events + excluded.events
"""
# Only a resume (`checkpoint_loaded`) on another world size starts a generation, and only
# if it is newer than the current one began: a late event of the old world, a leftover rank
# of it or a stray process with the same run id must not take the run over.
NEW_WORLD = """
UPDATE runs SET prev_world_size = world_size, world_size = ?, world_since = ?
WHERE run_id = ? AND world_size != ? AND world_since < ?
"""
# `step_ts` keeps when the position last moved; `prev_interval_s` the interval before (SET
# reads the row's old values). Rows follow the order of receipt (and of `seq`, then `ts`,
# inside one batch), never the sender's clock: a clock stepped back must not freeze them.
UPSERT_RANK = """
INSERT INTO ranks (run_id, world_size, rank, ts, host, local_rank, num_workers, epoch, step,
  lo, hi, cursors, rows_per_s, global_step, interval_s, tokens, blocks_per_split, step_ts,
  global_batch_size, skipped)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, world_size, rank) DO UPDATE SET
  step_ts = CASE WHEN excluded.global_step IS ranks.global_step AND excluded.step IS ranks.step
    AND excluded.epoch IS ranks.epoch THEN coalesce(ranks.step_ts, ranks.ts) ELSE excluded.ts END,

  prev_interval_s = ranks.interval_s, ts = excluded.ts, host = excluded.host,
  local_rank = excluded.local_rank, num_workers = excluded.num_workers,
  epoch = excluded.epoch, step = excluded.step, lo = coalesce(excluded.lo, lo),
  hi = coalesce(excluded.hi, hi), cursors = coalesce(excluded.cursors, cursors),
  rows_per_s = excluded.rows_per_s, global_step = excluded.global_step,
  interval_s = excluded.interval_s, tokens = excluded.tokens,
  blocks_per_split = excluded.blocks_per_split,
  global_batch_size = coalesce(excluded.global_batch_size, global_batch_size),
  skipped = excluded.skipped
"""
# One row per process, what the status rules read: `recv_ts` when the collector received
# its last report and `step_recv` its last step move (liveness is judged on these, the
# collector's clock); `step_ts` the same move on the process's clock (the timeline);
# `moved_s` the usual time between moves (received; a maximum decaying by 10 % a move),
# `clock_offset` how far the collector's clock is ahead of the process's (from its last
# batch's `sent_ts`: informative only).
UPSERT_PROCESS = """
INSERT INTO processes AS p (run_id, world_size, process, rank, mesh, host, ts, interval_s, epoch,
  step, global_step, step_ts, heartbeat_s, clock_offset, recv_ts, step_recv, seq)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, world_size, process) DO UPDATE SET
  step_ts = CASE WHEN excluded.global_step IS p.global_step AND excluded.step IS p.step
    AND excluded.epoch IS p.epoch THEN coalesce(p.step_ts, p.ts) ELSE excluded.ts END,
  step_recv = CASE WHEN excluded.global_step IS p.global_step AND excluded.step IS p.step
    AND excluded.epoch IS p.epoch THEN coalesce(p.step_recv, p.recv_ts, excluded.recv_ts)
    ELSE excluded.recv_ts END,
  moved_s = CASE WHEN excluded.global_step IS p.global_step AND excluded.step IS p.step
    AND excluded.epoch IS p.epoch THEN p.moved_s
    ELSE max(excluded.recv_ts - coalesce(p.step_recv, p.recv_ts, excluded.recv_ts),
      0.9 * coalesce(p.moved_s, 0)) END,
  prev_interval_s = p.interval_s, interval_s = excluded.interval_s, ts = excluded.ts,
  rank = excluded.rank, mesh = excluded.mesh, host = excluded.host, epoch = excluded.epoch,
  step = excluded.step, global_step = excluded.global_step,
  heartbeat_s = coalesce(excluded.heartbeat_s, p.heartbeat_s),
  clock_offset = coalesce(excluded.clock_offset, p.clock_offset),
  recv_ts = excluded.recv_ts, seq = excluded.seq
"""
# The highest event number stored per client (`senders`): a repeat or an older one is ignored.
UPSERT_SENDER = """
INSERT INTO senders (run_id, incarnation, seq) VALUES (?, ?, ?)
ON CONFLICT (run_id, incarnation) DO UPDATE SET seq = max(seq, excluded.seq)
"""
# A process of one attempt: its span of reports and how it ended (its last `closed`'s reason).
UPSERT_ATTEMPT = """
INSERT INTO attempts AS a (run_id, attempt, process, world_size, first_ts, last_ts, first_recv,
  last_recv, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, attempt, process) DO UPDATE SET world_size = excluded.world_size,
  first_ts = min(a.first_ts, excluded.first_ts), last_ts = max(a.last_ts, excluded.last_ts),
  first_recv = min(a.first_recv, excluded.first_recv),
  last_recv = max(a.last_recv, excluded.last_recv),
  reason = coalesce(excluded.reason, a.reason)
"""
INSERT_SAMPLE = """
INSERT INTO samples (run_id, rank, ts, step, rows, batches, wait_s, interval_s, tokens)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
UPSERT_ROLLUP = """
INSERT INTO rollup (run_id, rank, bucket, rows, batches, wait_s, interval_s, tokens)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, bucket, rank) DO UPDATE SET rows = rows + excluded.rows,
  batches = batches + excluded.batches, wait_s = wait_s + excluded.wait_s,
  interval_s = interval_s + excluded.interval_s,
  tokens = CASE WHEN excluded.tokens IS NULL THEN tokens
    ELSE coalesce(tokens, 0) + excluded.tokens END
"""
# An `epoch_end`: the epochs the rank finished and the step it stood at then (a rank whose
# last report is still at that step stopped at an epoch end).
EPOCH_ENDED = """
UPDATE ranks SET epochs_done = max(coalesce(epochs_done, 0), ?), end_step = ?
WHERE run_id = ? AND world_size = ? AND rank = ?
"""
PROCESS_EPOCH_ENDED = """
UPDATE processes SET epochs_done = max(coalesce(epochs_done, 0), ?), end_step = ?
WHERE run_id = ? AND world_size = ? AND process = ?
"""
INSERT_EVENT = "INSERT INTO events (run_id, ts, kind, rank, world_size, epoch, step, data, "
INSERT_EVENT += "global_step, process, recv_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def run_row(e: EventIn) -> dict[str, Any]:
    """The `runs` row a batch's first event of a run starts (the UPSERT_RUN parameters)."""
    return {
        "run_id": e.run_id, "first_ts": e.ts, "last_ts": e.ts, "num_splits": e.num_splits,
        "rows_per_split": e.rows_per_split, "batch_size": e.batch_size,
        "world_size": e.world_size, "events": 0, "total_epochs": None, "total_steps": None,
        "seq_len": None, "resumed_ts": None, "last_recv": None,
    }  # fmt: skip


def balance_skipped(e: EventIn) -> int | None:
    """A progress event's units skipped for balance this epoch (None: none, or an older
    client); anything but a positive integer under `wire.BALANCE_SKIPPED` is ignored."""
    value = e.data.get(BALANCE_SKIPPED)
    return value if type(value) is int and value > 0 else None
