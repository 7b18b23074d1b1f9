"""Every live run's process rows and throughput totals in one read each, for `/metrics`.

A scrape of 1,000 runs used to read them run by run (2,000 queries, each converting its
rows to `sqlite3.Row` and then to dicts): most of a 128,000-process scrape. Here one join
over the runs reported within the retention returns plain tuples, grouped by run in
Python: per run, what `Store.heartbeats` (the fields the status rules judge) and
`Store.rank_totals` give.
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter
from typing import Any

import orjson

from dashboard.collector.store import ROLLUP_S, Store

# what the status rules read of a process (`Store.heartbeats` has these and more), of a run's
# current world; CROSS JOIN keeps the runs the outer loop (else SQLite scans every process
# of every run, aged out or not)
JUDGED = (
    "process", "rank", "mesh", "ts", "interval_s", "prev_interval_s", "epoch", "step",
    "global_step", "step_ts", "moved_s", "epochs_done", "end_step", "heartbeat_s",
    "clock_offset", "recv_ts", "step_recv",
)  # fmt: skip
_PROCESSES = (
    f"SELECT p.run_id, {', '.join('p.' + c for c in JUDGED)} FROM runs r CROSS JOIN processes p "
    "ON p.run_id = r.run_id AND p.world_size = r.world_size "
    "WHERE coalesce(r.last_recv, r.last_ts) >= ? "
    "ORDER BY r.run_id, p.process"
)
# per rank of the current world, the rollup buckets from the one holding `last_ts - window`
_TOTALS = (
    "SELECT k.run_id, k.rank, sum(k.rows), sum(k.tokens), sum(k.wait_s), sum(k.interval_s) "
    "FROM runs r JOIN rollup k ON k.run_id = r.run_id "
    "AND k.bucket >= CAST((r.last_ts - ?) / ? AS INTEGER) AND k.rank < r.world_size "
    "WHERE coalesce(r.last_recv, r.last_ts) >= ? GROUP BY k.run_id, k.rank"
)


def live_processes(store: Store, since: float) -> dict[str, list[dict[str, Any]]]:
    """Run id → its processes' last reports (the `JUDGED` fields of `Store.heartbeats`'
    rows, in its order), for every run whose last report was received at or after `since`."""
    mesh = JUDGED.index("mesh") + 1
    out: dict[str, list[dict[str, Any]]] = {}
    for run_id, rows in groupby(store.tuples(_PROCESSES, since), key=itemgetter(0)):
        processes = out[run_id] = []
        for row in rows:
            p = dict(zip(JUDGED, row[1:], strict=True))
            if row[mesh]:
                p["mesh"] = orjson.loads(row[mesh])
            processes.append(p)
    return out


def live_totals(
    store: Store, since: float, window_s: float
) -> dict[str, dict[int, tuple[float, float | None, float, float]]]:
    """Run id → rank → (rows, tokens or None, wait seconds, covered seconds) summed over the
    run's last `window_s` (`Store.rank_totals`), for every run reported since `since`."""
    out: dict[str, dict[int, tuple[float, float | None, float, float]]] = {}
    for run_id, rank, rows, tokens, wait_s, covered in store.tuples(
        _TOTALS, window_s, ROLLUP_S, since
    ):
        out.setdefault(run_id, {})[rank] = (rows, tokens, wait_s, covered)
    return out
