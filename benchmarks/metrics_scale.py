"""`GET /metrics` at scale: how long one scrape takes for many runs and many processes.

    .venv/bin/python benchmarks/metrics_scale.py             # the figures in docs/dashboard.md
    .venv/bin/python benchmarks/metrics_scale.py --runs 100 --processes 128

Each scenario fills a fresh store (two heartbeats per process, straight into the store) and
times `dashboard.collector.metrics.scrape` (the whole body the route returns), median of
`REPEAT`, in wall-clock and CPU seconds (on a shared machine the wall clock mostly measures
the other jobs):
every run live; every run but 10 ended longer ago than the metrics retention (they age out
of /metrics); and a few runs of 1,024 processes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dashboard.collector.metrics import METRICS_KEEP_S, scrape
from dashboard.collector.models import EventIn
from dashboard.collector.status import DEFAULT_HEALTH
from dashboard.collector.store import Retention, Store

REPEAT = 5


def _heartbeat(run: str, rank: int, world: int, ts: float, step: int) -> EventIn:
    return EventIn(
        run_id=run, kind="progress", ts=ts, host="node", rank=rank, world_size=world,
        num_splits=world, rows_per_split=10_000, epoch=0, step=step, global_step=step,
        splits=[rank, rank + 1], cursors=[step], rows=100, batches=1, wait_s=0.05,
        interval_s=1.0, rows_per_s=100.0, heartbeat_s=1.0,
    )  # fmt: skip


def fill(store: Store, runs: int, processes: int, live: int, now: float) -> None:
    """`runs` runs of `processes` processes; all but `live` ended an hour ago."""
    for k in range(runs):
        end = now if k < live else now - METRICS_KEEP_S - 3600
        events = [
            _heartbeat(f"run-{k}", r, processes, end - s, 9 - s)
            for s in (1, 0)
            for r in range(processes)
        ]
        store.ingest(events, now=now)


def measure(runs: int, processes: int, live: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "m.db", Retention(keep_runs=10**6, new_runs_per_minute=10**6))
        now = time.time()
        fill(store, runs, processes, live, now)
        times, cpu, body = [], [], b""
        for _ in range(REPEAT):
            start, used = time.perf_counter(), time.process_time()
            body = scrape(store, DEFAULT_HEALTH, now=now)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - used)
        store.close()
    lines = body.count(b"\n")
    print(
        f"{runs:>5,} runs x {processes:>5,} processes, {live:>5,} live: "
        f"{statistics.median(times):6.2f} s ({statistics.median(cpu):.2f} s CPU), "
        f"{len(body) / 1e6:6.1f} MB, {lines:>9,} lines"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="one scenario: this many runs")
    parser.add_argument("--processes", type=int, default=128, help="processes per run")
    parser.add_argument("--live", type=int, default=None, help="runs still reporting")
    args = parser.parse_args()
    if args.runs is not None:
        measure(args.runs, args.processes, args.runs if args.live is None else args.live)
        return
    measure(1000, 128, 10)
    measure(4, 1024, 4)
    measure(1000, 128, 1000)


if __name__ == "__main__":
    main()
