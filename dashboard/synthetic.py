"""Realistic telemetry for R ranks without a training job: for tests, benchmarks, demos.

Events have exactly the shape `loader/telemetry/client.py` sends (one `progress` per rank per
second, cursors of the rank's splits advancing round-robin, checkpoints and a resume), so
the collector, its benchmark and the browser test exercise the real wire format.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from loader import wire
from loader.layout import owned_splits, rank_shares, slice_bounds, uses_steps


@dataclass(frozen=True)
class SyntheticRun:
    """One world size's stretch of a run; `world_size_before` makes it start with a resume."""

    run_id: str
    world_size: int
    num_splits: int
    rows_per_split: int
    seconds: int
    start_ts: float
    rows_per_s: float = 2000.0
    batch_size: int = 32
    num_workers: int = 2
    slow_rank: int | None = None
    checkpoint_every: int = 0
    world_size_before: int | None = None
    start_rows: int = 0
    total_epochs: int | None = None
    closed: bool = False  # every rank sends `closed` after its last report (a clean end)
    # G: with G a multiple of S any W <= G works, ranks sharing the splits at their edges
    # (loader.layout); batch_size is then each rank's slice of G
    global_batch_size: int | None = None
    # ranks that read at half the others' rate (a placement that is behind) and a rank that
    # stops reporting after `crash_at` seconds without a `closed` (the collector: crashed)
    behind_ranks: tuple[int, ...] = ()
    crashed_rank: int | None = None
    crash_at: int = 0


def _batch(run: SyntheticRun, rank: int) -> int:
    if run.global_batch_size is None:
        return run.batch_size
    lo, hi = slice_bounds(rank, run.world_size, run.global_batch_size)
    return hi - lo


def _static(run: SyntheticRun, rank: int) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "host": f"node{rank // 8}",
        "rank": rank,
        "local_rank": rank % 8,
        "world_size": run.world_size,
        "num_workers": run.num_workers,
        "num_splits": run.num_splits,
        "rows_per_split": run.rows_per_split,
        "batch_size": _batch(run, rank),
        "total_epochs": run.total_epochs,
    } | ({"global_batch_size": run.global_batch_size} if run.global_batch_size else {})


def cache_event(run: SyntheticRun, rank: int, ts: float, **totals: Any) -> dict[str, Any]:
    """A `cache` report of the node cache `totals["cache_dir"]` on `rank`'s host, as
    `loader.telemetry.reporter.tell_caches` sends it (counters since the loader started)."""
    static = _static(run, rank)
    return {**static, "kind": wire.CACHE, "ts": ts, "data": {"host": static["host"], **totals}}


def with_caches(
    run: SyntheticRun, events: Iterable[dict[str, Any]], every_s: int = 5
) -> Iterator[dict[str, Any]]:
    """`events` with a warm node cache on each host: every `every_s` seconds its first rank
    reports the node's totals (96 % hits, one file in 25 from the store), as a demo shows."""
    said = run.start_ts
    for ev in events:
        yield ev
        if ev["ts"] - said < every_s:
            continue
        said = ev["ts"]
        t = int(ev["ts"] - run.start_ts)
        for rank in range(0, run.world_size, 8):  # `_static`: 8 ranks a host
            if rank == run.crashed_rank and t > run.crash_at:
                continue
            hits, misses = 24 * t, t
            yield cache_event(
                run, rank, ev["ts"], cache_dir="/local/nvme/cache", hits=hits, misses=misses,
                bytes_from_store=misses * 64 << 20, bytes_from_cache=hits * 64 << 20,
                evictions=0, refetched=0, prefetched=misses, prefetch_lead=4,
            )  # fmt: skip


def _position(run: SyntheticRun, rank: int, rows: float) -> dict[str, Any]:
    step = int(rows // _batch(run, rank))
    return {"epoch": 0, "step": step, "global_step": step}


def _cursors(run: SyntheticRun, rank: int, rows: float) -> list[int]:
    """Cursors after `rows` rows of the rank: of its round-robin stream (capped at the
    split), or in the step layout the global cursors after its steps (G/S rows a split
    each, the same on every rank)."""
    owned = owned_splits(rank, run.world_size, run.num_splits, run.global_batch_size)
    if uses_steps(run.num_splits, run.global_batch_size):
        assert run.global_batch_size is not None
        level = _position(run, rank, rows)["step"] * (run.global_batch_size // run.num_splits)
        return [min(run.rows_per_split, level)] * len(owned)
    base, extra = divmod(int(rows), len(owned))
    return [min(run.rows_per_split, base + (i < extra)) for i in range(len(owned))]


def synthetic_events(run: SyntheticRun) -> Iterator[dict[str, Any]]:
    """Events of every rank, second by second, in time order."""
    world, splits, batch = run.world_size, run.num_splits, run.global_batch_size
    owned = [owned_splits(r, world, splits, batch) for r in range(world)]
    # rows a rank reads in an epoch: its part of each split it reads (shared ones in part)
    length = run.rows_per_split
    shares = [
        sum(length * n // of for n, of in rank_shares(r, world, splits, batch))
        for r in range(world)
    ]
    done = [float(run.start_rows)] * run.world_size
    for r in range(run.world_size) if run.world_size_before else ():
        yield {
            **_static(run, r),
            "kind": wire.CHECKPOINT_LOADED,
            "ts": run.start_ts,
            **_position(run, r, run.start_rows),
            "data": {"world_size_before": run.world_size_before, "path": "ckpt.json"},
        }
    for t in range(1, run.seconds + 1):
        ts = run.start_ts + t
        for r in range(run.world_size):
            if r == run.crashed_rank and t > run.crash_at:
                continue  # killed: no report, no `closed`
            # In DDP, collectives equalise rows/s: a slow reader shows as a long data wait.
            rows = run.rows_per_s / (2 if r in run.behind_ranks else 1)
            done[r] += rows
            batches = max(1, int(rows // _batch(run, r)))
            wait = 0.6 if r == run.slow_rank else 0.02
            yield {
                **_static(run, r),
                "kind": wire.PROGRESS,
                "ts": ts,
                **_position(run, r, done[r]),
                "splits": [owned[r].start, owned[r].stop],
                "cursors": _cursors(run, r, done[r]),
                "rows": int(rows),
                "batches": batches,
                "wait_s": wait,
                "interval_s": 1.0,
                "rows_per_s": rows,
            }
            share = shares[r]
            if done[r] >= share > done[r] - rows:  # the rank read its share: its epoch ended
                yield {
                    **_static(run, r),
                    "kind": wire.EPOCH_END,
                    "ts": ts,
                    **_position(run, r, done[r]),
                }
            if run.checkpoint_every and t % run.checkpoint_every == 0:
                yield {
                    **_static(run, r),
                    "kind": wire.CHECKPOINT_SAVED,
                    "ts": ts,
                    **_position(run, r, done[r]),
                    "data": {"path": f"checkpoints/step-{int(done[r] // _batch(run, r)):06d}.json"},
                }
    end = run.start_ts + run.seconds
    for r in range(run.world_size) if run.closed else ():
        ev = {**_static(run, r), "kind": wire.CLOSED, "ts": end, **_position(run, r, done[r])}
        yield ev | {"data": {"reason": "close"}}


def post_events(
    url: str, events: Iterable[dict[str, Any]], token: str | None = None, chunk: int = 500
) -> int:
    """POST events to a collector in batches of `chunk`; returns how many were accepted."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    accepted, batch = 0, []
    for ev in [*events, None]:
        if ev is not None:
            batch.append(ev)
        if batch and (ev is None or len(batch) >= chunk):
            body = orjson.dumps({"events": batch})
            req = urllib.request.Request(url.rstrip("/") + "/api/events", body, headers)
            with opener.open(req, timeout=30) as resp:
                accepted += orjson.loads(resp.read())["accepted"]
            batch = []
    return accepted


def post_live(url: str, events: Iterable[dict[str, Any]]) -> int:
    """POST events (in time order) no earlier than their `ts`: those already past at once (a
    run's history, in chunks), each later second when it comes, so the run reads as live
    however long the history took to post (on a loaded machine, 1,024 ranks' minute takes
    longer than the 10 beats after which a silent rank reads stalled). Returns how many
    were accepted."""
    accepted, due = 0, list[dict[str, Any]]()
    for ev in events:
        if ev["ts"] > time.time() and due:
            accepted += post_events(url, due)
            due = []
        while ev["ts"] > time.time():
            time.sleep(min(1.0, ev["ts"] - time.time()))
        due.append(ev)
    return accepted + (post_events(url, due) if due else 0)


def main(argv: list[str] | None = None) -> int:
    """`python -m dashboard.synthetic URL --ranks 1024 --splits 4096`: a run for a demo or a
    screenshot, posted to the collector at URL, a minute of history, then live for
    `--follow` seconds (Ctrl-C stops it)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("url", help="the collector, e.g. http://127.0.0.1:8765")
    parser.add_argument("--run-id", default="synthetic")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--splits", type=int, default=4096)
    parser.add_argument("--rows-per-split", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--slow-rank", type=int, default=None)
    parser.add_argument("--behind-ranks", type=int, nargs="*", default=[], help="read at half rate")
    parser.add_argument("--crashed-rank", type=int, default=None, help="silent after 1/4 of it")
    parser.add_argument("--total-epochs", type=int, default=None)
    parser.add_argument("--global-batch", type=int, default=None, help="G (any W <= G)")
    parser.add_argument(
        "--follow", type=int, default=600, help="seconds it goes on reporting live (0: none)"
    )
    parser.add_argument("--no-cache", action="store_true", help="no node cache reports")
    args = parser.parse_args(argv)
    if args.follow < 0:
        parser.error(f"--follow must be 0 or more seconds, got {args.follow}")
    run = SyntheticRun(
        args.run_id,
        args.ranks,
        args.splits,
        args.rows_per_split,
        args.seconds + args.follow,
        time.time() - args.seconds,
        slow_rank=args.slow_rank,
        checkpoint_every=max(1, args.seconds // 3),
        total_epochs=args.total_epochs,
        global_batch_size=args.global_batch,
        behind_ranks=tuple(args.behind_ranks),
        crashed_rank=args.crashed_rank,
        crash_at=args.seconds // 4,
    )
    print(f"posting a {args.seconds} s history, then live for {args.follow} s", flush=True)
    try:
        events = synthetic_events(run)
        events = events if args.no_cache else with_caches(run, events)
        print(f"posted {post_live(args.url, events):,} events to {args.url}")
    except KeyboardInterrupt:
        print("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
