"""What an ingest decides before it writes: which events are new (idempotence) and when
each was received on the collector's clock (liveness). Kept apart from `store.py`, which
writes them; both read only through the writer connection the store holds under its lock.

Each client numbers its events (`incarnation`, random per client object, and `seq`), so a
batch retried after a lost answer, or replayed by anyone, changes nothing. A receipt is the
arrival less the time the event waited in its sender: that wait is `sent_ts - ts`, a
duration on the sender's one clock, so skew, a step or a zeroed `sent_ts` cancel out.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from dashboard.collector.models import EventIn

MAX_WAIT_S = 5.0  # the longest an event is believed to have waited in its sender


def fresh(
    conn: sqlite3.Connection, events: Sequence[EventIn]
) -> tuple[list[EventIn], dict[tuple[str, str], int]]:
    """The events not seen before, in their senders' order (`seq`, then `ts`: events
    of clients without `seq` are all new), and each sender's new highest number."""
    keys = {(e.run_id, e.incarnation) for e in events if e.incarnation is not None}
    known: dict[tuple[str, str], int] = {}
    for run_id, incarnation in keys:  # a batch is one client's: one or two reads
        row = conn.execute(
            "SELECT seq FROM senders WHERE run_id = ? AND incarnation = ?",
            (run_id, incarnation),
        ).fetchone()
        if row is not None:
            known[run_id, incarnation] = row[0]
    fresh = []
    for e in sorted(events, key=lambda e: (e.seq is None, e.seq or 0, e.ts)):
        if e.incarnation is not None and e.seq is not None:
            key = (e.run_id, e.incarnation)
            if e.seq <= known.get(key, -1):
                continue
            known[key] = e.seq
        fresh.append(e)
    senders = {k: v for k, v in known.items() if k in keys}
    return fresh, senders


def received(conn: sqlite3.Connection, events: Sequence[EventIn], arrived: float) -> list[float]:
    """Each event's receipt on the collector's clock: `arrived`, less the time it waited
    in its sender (`sent_ts - ts` of its batch, a duration on the sender's one clock, so a
    skewed, stepped or zeroed clock cancels out; 0 to `MAX_WAIT_S`). An event whose
    batch carries no `sent_ts` (replayed history, clients older than it) is put at its
    `ts` shifted by its process's last measured offset, never after `arrived`."""
    sent = {(e.run_id, e.process): e.sent_ts for e in events if e.sent_ts is not None}
    offsets: dict[tuple[str, int], float] = {}
    for run_id, process in {(e.run_id, e.process) for e in events} - set(sent):
        row = conn.execute(
            "SELECT clock_offset FROM processes WHERE run_id = ? AND process = ? "
            "ORDER BY recv_ts DESC LIMIT 1",
            (run_id, process),
        ).fetchone()
        offsets[run_id, process] = (row[0] or 0.0) if row is not None else 0.0
    out = []
    for e in events:
        sent_ts = sent.get((e.run_id, e.process))
        if sent_ts is None:
            out.append(min(arrived, e.ts + offsets[e.run_id, e.process]))
        else:
            out.append(arrived - min(MAX_WAIT_S, max(0.0, sent_ts - e.ts)))
    return out
