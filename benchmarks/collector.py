"""Collector benchmark: ingest rate, and query latency on a 64-rank, hour-long run.

    .venv/bin/python benchmarks/collector.py                  # the figures in docs/dashboard.md
    .venv/bin/python benchmarks/collector.py --ranks 8 --seconds 600 --ingest-s 3

The collector runs as its own uvicorn process (as `elastic-loader dashboard` would serve
it), so the senders here do not share its GIL. Ingest is measured over HTTP with a few
concurrent senders, at the batch size a rank really sends (1-3 events a second) and at
100 events per request; the hour-long run is then loaded straight into the store, and each
dashboard query is timed over HTTP (median and p95 of repeated calls).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson

from dashboard.collector.models import EventIn
from dashboard.collector.store import Store
from dashboard.launch import start_collector_process
from dashboard.synthetic import SyntheticRun, synthetic_events

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
JSON = {"Content-Type": "application/json"}


def _request(url: str, body: bytes | None = None) -> bytes:
    """GET, or POST `body` as JSON."""
    req = urllib.request.Request(url, body, JSON if body else {})
    with OPENER.open(req, timeout=30) as resp:
        return bytes(resp.read())


def ingest_rate(url: str, per_request: int, senders: int, seconds: float) -> float:
    """Events per second accepted by `senders` threads posting `per_request`-event batches."""
    # In the past: the collector refuses events more than 5 minutes ahead of its clock.
    run = SyntheticRun(f"ingest-{per_request}", 64, 64, 10**9, 10_000, time.time() - 10_000)
    events = synthetic_events(run)
    bodies = [
        orjson.dumps({"events": [next(events) for _ in range(per_request)]}) for _ in range(200)
    ]
    counts = [0] * senders
    stop = time.monotonic() + seconds

    def send(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            _request(url + "/api/events", bodies[n % len(bodies)])
            n += 1
        counts[i] = n * per_request

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def load_hour(db: Path, ranks: int, seconds: int) -> int:
    """A `ranks`-rank run of `seconds` (one progress event per rank per second)."""
    store = Store(db)
    start = time.time() - seconds
    run = SyntheticRun("hour", ranks, ranks * 4, 10**7, seconds, start, slow_rank=ranks - 1)
    run = SyntheticRun(**{**run.__dict__, "checkpoint_every": 300})
    batch: list[EventIn] = []
    total = 0
    for event in synthetic_events(run):
        batch.append(EventIn.model_validate(event))
        if len(batch) == 2000:
            total += store.ingest(batch)
            batch = []
    total += store.ingest(batch) if batch else 0
    store.close()
    return total


def latency_ms(call: Callable[[], bytes], repeat: int) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        size = len(call())
        times.append(1000 * (time.perf_counter() - t0))
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))], size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=3600)
    parser.add_argument("--ingest-s", type=float, default=5.0, help="seconds per ingest case")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        proc, url = start_collector_process(db)
        try:
            print(
                "## ingest over HTTP\n\n| events per request | senders | events/s |\n|---|---|---|"
            )
            for per_request in (1, 3, 100):
                rate = ingest_rate(url, per_request, args.senders, args.ingest_s)
                print(f"| {per_request} | {args.senders} | {rate:,.0f} |")
            t0 = time.perf_counter()
            n = load_hour(db, args.ranks, args.seconds)
            print(f"\nloaded {n:,} events ({args.ranks} ranks × {args.seconds} s) straight into ")
            print(f"the store in {time.perf_counter() - t0:.1f} s\n")
            print("## dashboard queries on that run (HTTP, ms)\n")
            print("| query | median | p95 | bytes |\n|---|---|---|---|")
            base = f"{url}/api/runs/hour"
            queries = {
                "runs": f"{url}/api/runs",
                "status": f"{base}/status",
                "placement": f"{base}/placement",
                "progress": f"{base}/progress",
                "throughput, last 5 min, 120 points": f"{base}/throughput?window_s=300",
                "throughput, whole hour, 120 points": f"{base}/throughput?window_s=3600",
                "timeline": f"{base}/timeline",
            }
            for name, q in queries.items():
                med, p95, size = latency_ms(functools.partial(_request, q), args.repeat)
                print(f"| {name} | {med:.1f} | {p95:.1f} | {size:,} |")
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
