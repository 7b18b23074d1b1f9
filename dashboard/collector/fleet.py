"""Every live run's process rows and throughput totals in one read each, for `/metrics`.

A scrape of 1,000 runs used to read them run by run (2,000 queries, each converting its
rows to `sqlite3.Row` and then to dicts): most of a 128,000-process scrape. Here one join
over the runs reported within the retention returns plain tuples, grouped by run in
Python; the rows are the same as `Store.heartbeats` and `Store.rank_totals` give per run.
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter
from typing import Any

import orjson

from dashboard.collector.store import ROLLUP_S, Store

# a run's current world only, as `Store.heartbeats` reads it; CROSS JOIN keeps the runs the
# outer loop (else SQLite scans every process of every run, aged out or not)
_PROCESSES = (
    "SELECT p.* FROM runs r CROSS JOIN processes p ON p.run_id = r.run_id "
    "AND p.world_size = r.world_size WHERE r.last_ts >= ? ORDER BY r.run_id, p.process"
)
# per rank of the current world, the rollup buckets from the one holding `last_ts - window`
_TOTALS = (
    "SELECT k.run_id, k.rank, sum(k.rows), sum(k.tokens), sum(k.wait_s), sum(k.interval_s) "
    "FROM runs r JOIN rollup k ON k.run_id = r.run_id "
    "AND k.bucket >= CAST((r.last_ts - ?) / ? AS INTEGER) AND k.rank < r.world_size "
    "WHERE r.last_ts >= ? GROUP BY k.run_id, k.rank"
)


def live_processes(store: Store, since: float) -> dict[str, list[dict[str, Any]]]:
    """Run id → its processes' last reports (`Store.heartbeats`' rows), for every run whose
    last report is at or after `since`."""
    cursor = store.cursor(_PROCESSES, since)
    names = [d[0] for d in cursor.description]
    mesh = names.index("mesh")
    out: dict[str, list[dict[str, Any]]] = {}
    for run_id, rows in groupby(cursor.fetchall(), key=itemgetter(0)):
        processes = out[run_id] = []
        for row in rows:
            p = dict(zip(names, row, strict=True))
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
