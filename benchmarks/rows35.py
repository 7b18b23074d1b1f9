"""Issue #35 item 7 in one process: ours (no workers) ÷ lance.torch's ShardedBatchSampler on
the same local Lance table, alternating, ratios within a repetition; and an A/B of ours' read
paths (`--ab`: the reader's `direct_reads` switch flipped between alternating epochs).

    PYTHONPATH=.:benchmarks .venv/bin/python benchmarks/rows35.py --uri /tmp/rows35/rows.lance \\
        --rows 1000000 --reps 5 [--workers 0] [--ab]

The table is built at `--uri` if missing (`build_data.make_batch`: id int64, x float32[128],
label int64, 528 B a row, one fragment). Ours: S = 48, C = 1,024, b = 1,024, its defaults
otherwise (`reads_in_flight` 4 without workers). lance.torch: `LanceDataset(batch_size=1024,
sampler=ShardedBatchSampler(0, 1, randomize=True))`, in the main process (w = 0) as its
documentation shows. Each measurement reads one epoch (or `--max-rows`) after its first batch.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

COLUMNS = ["id", "x", "label"]
SEED = 0


def build(uri: str, rows: int) -> None:
    """The benchmark table at `uri`, unless it is there with `rows` rows."""
    import lance
    import pyarrow as pa
    from build_data import CHUNK, make_batch

    if os.path.isdir(uri) and lance.dataset(uri).count_rows() == rows:
        return
    batches = (make_batch(s, min(s + CHUNK, rows), SEED) for s in range(0, rows, CHUNK))
    schema = make_batch(0, 1, SEED).schema
    reader = pa.RecordBatchReader.from_batches(schema, batches)
    lance.write_dataset(reader, uri, mode="overwrite")


def ours(
    uri: str, workers: int, direct_reads: bool | None, in_flight: int | None = None
) -> Iterable[Any]:
    from loader import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        uri, columns=COLUMNS, num_splits=48, shuffle_seed=SEED, shuffle_clump_size=1024
    )
    if direct_reads is not None:
        ds.reader.direct_reads = direct_reads
    kw = {} if in_flight is None else {"reads_in_flight": in_flight}
    return StreamingDataLoader(ds, batch_size=1024, num_workers=workers, **kw)


def lance_torch(uri: str, workers: int, *_: Any) -> Iterable[Any]:
    import torch
    from lance.sampler import ShardedBatchSampler
    from lance.torch.data import LanceDataset

    assert workers == 0, "lance.torch's sampler shards by rank, not by worker"
    sampler = ShardedBatchSampler(0, 1, randomize=True, seed=SEED)
    ds = LanceDataset(
        uri, batch_size=1024, columns=COLUMNS, sampler=sampler, auto_detect_rank=False
    )
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)


def rate(make: Callable[[], Iterable[Any]], max_rows: int) -> tuple[float, float]:
    """Rows per second of wall time and per CPU-second of this process (all its threads,
    Lance's too) from the first batch on, for `max_rows` rows or the epoch. The CPU figure
    is the steadier one on a shared machine: other processes' load stretches wall time."""
    it = iter(make())
    next(it)
    start, cpu, rows = time.perf_counter(), time.process_time(), 0
    for batch in it:
        rows += len(batch["id"])
        if rows >= max_rows:
            break
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    del it
    return rows / seconds, rows / max(cpu, 1e-9)


def spread(values: list[float]) -> str:
    return f"{np.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default="/tmp/rows35/rows.lance")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--max-rows", type=int, default=1 << 30)
    ap.add_argument("--ab", action="store_true", help="ours with direct reads on ÷ off")
    ap.add_argument("--in-flight", type=int, nargs="*", default=[], help="--ab: more arms")
    args = ap.parse_args()
    build(args.uri, args.rows)
    if args.ab:
        cases = {"ours_direct": (ours, (True, None)), "ours_take": (ours, (False, None))}
        for n in args.in_flight:  # the same switch with other reads in flight
            cases[f"direct_f{n}"] = (ours, (True, n))
            cases[f"take_f{n}"] = (ours, (False, n))
        pairs = [(a, "ours_take") for a in cases if a != "ours_take"]
    else:
        cases = {"ours": (ours, (None, None)), "lance_torch": (lance_torch, (None, None))}
        pairs = [("ours", "lance_torch")]

    def make(name: str) -> Callable[[], Iterable[Any]]:
        fn, switch = cases[name]
        return lambda: fn(args.uri, args.workers, *switch)

    for name in cases:  # warm-up: page cache, Numba, imports (workers: CPU is the main's only)
        rate(make(name), 50_000)
    rates: dict[str, list[float]] = {name: [] for name in cases}
    per_cpu: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.reps):
        order = random.Random(rep).sample(list(cases), len(cases))
        for name in order:
            r, c = rate(make(name), args.max_rows)
            rates[name].append(r)
            per_cpu[name].append(c)
            line = (
                f"  rep {rep} {name:12s} w={args.workers} {r:>12,.0f} rows/s {c:>12,.0f} rows/cpu-s"
            )
            print(line, flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f}; w={args.workers}; {args.reps} reps")
    print("| reader | rows/s (median) | rows per CPU-second (median) |\n|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {np.median(values):,.0f} | {np.median(per_cpu[name]):,.0f} |")
    print("| ratio (median, range of the per-repetition ratios) | wall | CPU |\n|---|---|---|")
    for a, b in pairs:
        wall = spread(list(np.divide(rates[a], rates[b])))
        print(f"| {a} ÷ {b} | {wall} | {spread(list(np.divide(per_cpu[a], per_cpu[b])))} |")


if __name__ == "__main__":
    main()
