"""Issue #12's targets in one run: reads in flight on a slow store, and ours vs lance.torch.

1. A moto S3 server on 127.0.0.1 with the benchmark table (``--rows`` rows of 528 B), and
   the fault-injecting proxy of tests/netproxy.py in front of it, in this process (the
   measured processes only read). For each injected delay (``--delays`` ms per request),
   ``ours_s3`` and ``raw_take_s3`` (Lance takes of the same reads, as many in flight), each
   in a fresh process; repetitions interleave delays and readers.
2. ``ours_s3`` with 1, 4 and 16 reads in flight at one delay: rows/s, and peak RSS beside
   the bound the knob sets on reads held: (reads_in_flight + 2) reads of ``read_size`` rows.
3. Locally (benchmarks/data, page cache warm): ours and lance.torch+ShardedBatchSampler at
   w = 0, 2 and W = 1, 2 (``run.py``'s cases).

Ratios are taken within a repetition; the table shows medians and ranges.

    benchmarks/.venv/bin/python benchmarks/targets12.py --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import COLUMNS, HERE, OUT, TABLE, Case, median
from run import launch
from s3_readers import ENV_DB, ENV_OPTIONS

sys.path.insert(0, str(HERE.parent))  # tests.object_store, tests.netproxy
from tests.netproxy import FaultProxy, Faults
from tests.object_store import running_s3_server

ROW_BYTES = 528
READ_ROWS = 8192  # the loader's read_size


def build_s3_table(options: dict[str, str], bucket: str, rows: int) -> str:
    import lancedb
    import pyarrow as pa
    from build_data import CHUNK, make_batch

    db = f"s3://{bucket}/db"
    batches = (make_batch(s, min(s + CHUNK, rows), 0) for s in range(0, rows, CHUNK))
    data = pa.RecordBatchReader.from_batches(make_batch(0, 1, 0).schema, batches)
    lancedb.connect(db, storage_options=options).create_table(TABLE, data=data)
    return db


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})" if values else "–"


def measure(case: Case, proxy: FaultProxy | None = None, delay_ms: float = 0.0) -> dict[str, Any]:
    if proxy is not None:
        proxy.faults = Faults(delay_s=delay_ms / 1000)
    rec = launch(case)
    if "error" in rec:
        raise RuntimeError(f"{case.loader} failed: {rec['error']}")
    print(
        f"  {case.loader:12s} w={case.num_workers} W={case.world_size} delay={delay_ms:>4} ms "
        f"R={case.reads_in_flight} {rec['rows_per_s']:>12,.0f} rows/s "
        f"peak {rec['peak_rss_mib']:.0f} MiB",
        flush=True,
    )
    return rec


def object_store_rows(args: argparse.Namespace) -> dict[str, Any]:
    delays = [float(d) for d in args.delays.split(",")]
    s3_case = Case(
        loader="ours_s3", num_splits=8, max_rows=args.max_rows, max_seconds=10 * args.max_seconds
    )  # S = 8 as in the figure (3.9k rows/s): 8 runs of 1,024 rows a read
    rates: dict[tuple[str, float], list[float]] = {}
    memory: dict[int, list[tuple[float, float]]] = {}  # reads in flight: (rows/s, MiB)
    with running_s3_server() as server:
        bucket = server.make_bucket("bench")
        t0 = time.perf_counter()
        db = build_s3_table(server.storage_options, bucket, args.rows)
        print(f"table on S3: {args.rows:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)
        with FaultProxy((server.host, server.port)) as proxy:
            os.environ[ENV_DB] = db
            os.environ[ENV_OPTIONS] = json.dumps(
                {**server.storage_options, "endpoint": proxy.endpoint}
            )
            for rep in range(args.reps):
                todo = [(d, r) for d in delays for r in ("ours_s3", "raw_take_s3")]
                for delay, name in random.Random(rep).sample(todo, len(todo)):
                    rec = measure(dataclasses.replace(s3_case, loader=name), proxy, delay)
                    rates.setdefault((name, delay), []).append(rec["rows_per_s"])
                for r in (1, 4, 16):
                    case = dataclasses.replace(s3_case, reads_in_flight=r)
                    rec = measure(case, proxy, args.memory_delay)
                    memory.setdefault(r, []).append((rec["rows_per_s"], rec["peak_rss_mib"]))
    return {"delays": delays, "rates": rates, "memory": memory, "memory_delay": args.memory_delay}


def local_rows(args: argparse.Namespace) -> dict[tuple[str, int, int], list[float]]:
    rates: dict[tuple[str, int, int], list[float]] = {}
    matrix = [(n, w, ws) for n in ("ours", "lance_torch") for w in (0, 2) for ws in (1, 2)]
    for rep in range(args.reps):
        for name, w, ws in random.Random(100 + rep).sample(matrix, len(matrix)):
            case = Case(loader=name, num_workers=w, world_size=ws, max_seconds=args.max_seconds)
            rates.setdefault((name, w, ws), []).append(measure(case)["rows_per_s"])
    return rates


def report(s3: dict[str, Any], local: dict[tuple[str, int, int], list[float]]) -> str:
    rates, delays = s3["rates"], s3["delays"]
    lines = [
        "| figure | measured: median (range) | target |",
        "|---|---|---|",
    ]
    for d in delays:
        ratios = list(np.divide(rates[("ours_s3", d)], rates[("raw_take_s3", d)]))
        lines.append(
            f"| ours ÷ raw Lance take, same reads, 16 in flight, S3 +{d:g} ms/request "
            f"| {spread(ratios)} | ≥ 0.9 |"
        )
    hi, lo = max(delays), min(delays)
    lines.append(
        f"| ours at {hi:g} ms ÷ ours at {lo:g} ms | "
        f"{spread(list(np.divide(rates[('ours_s3', hi)], rates[('ours_s3', lo)])))} | ≥ 0.5 |"
    )
    lines.append(
        f"| raw take at {hi:g} ms ÷ raw take at {lo:g} ms (the store's own bound) | "
        f"{spread(list(np.divide(rates[('raw_take_s3', hi)], rates[('raw_take_s3', lo)])))} "
        "| info |"
    )
    for w in (0, 2):
        for ws in (1, 2):
            if ("ours", w, ws) in local:
                ratios = list(np.divide(local[("ours", w, ws)], local[("lance_torch", w, ws)]))
                lines.append(
                    f"| ours ÷ lance.torch+ShardedBatchSampler, local, w={w} W={ws} "
                    f"| {spread(ratios)} | ≥ 1.0 |"
                )
    for r, runs in s3["memory"].items():
        bound = (r + 2) * READ_ROWS * ROW_BYTES / 2**20
        lines.append(
            f"| ours on S3 +{s3['memory_delay']:g} ms, reads_in_flight={r}: rows/s; peak RSS "
            f"(reads held ≤ {bound:.0f} MiB) | {median(x for x, _ in runs):,.0f} rows/s; "
            f"{median(m for _, m in runs):.0f} MiB | bounded |"
        )
    lines += ["", "| reader | delay (ms) | rows/s (median) |", "|---|---|---|"]
    for (name, d), values in sorted(rates.items()):
        lines.append(f"| {name} | {d:g} | {median(values):,.0f} |")
    for (name, w, ws), values in sorted(local.items()):
        lines.append(f"| {name} local w={w} W={ws} | – | {median(values):,.0f} |")
    return "\n".join(lines) + "\n"


def plot(s3: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name in ("ours_s3", "raw_take_s3"):
        ys = [median(s3["rates"][(name, d)]) for d in s3["delays"]]
        ax.plot(s3["delays"], ys, marker="o", label=name)
    ax.set_xlabel("injected delay per request (ms)")
    ax.set_ylabel("rows/s (median)")
    ax.set_title("moto S3 on loopback, 16 reads in flight")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=131_072, help="rows of the S3 table")
    ap.add_argument("--delays", default="0,10,50", help="ms per request, comma-separated")
    ap.add_argument("--memory-delay", type=float, default=50.0, help="ms, for the R rows")
    ap.add_argument("--max-rows", type=int, default=1 << 17, help="per S3 measurement")
    ap.add_argument("--max-seconds", type=float, default=6.0, help="local; S3: x10")
    ap.add_argument("--no-local", action="store_true", help="skip the local lance.torch rows")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    s3 = object_store_rows(args)
    local = {} if args.no_local else local_rows(args)
    text = report(s3, local)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    header = f"Made by `benchmarks/targets12.sh` ({' '.join(sys.argv[1:])}), run {stamp}.\n\n"
    (OUT / "targets12.md").write_text(header + text)
    print(header + text)
    try:
        plot(s3, OUT / "targets12.png")
    except ImportError:
        print("matplotlib missing: no plot (benchmarks/.venv has it)")
    raw = {
        "s3": {f"{k[0]}@{k[1]:g}": v for k, v in s3["rates"].items()},
        "memory": s3["memory"],
        "local": {f"{k[0]} w={k[1]} W={k[2]}": v for k, v in local.items()},
        "columns": list(COLUMNS),
    }
    (OUT / "targets12.json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
