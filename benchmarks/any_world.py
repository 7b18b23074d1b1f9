"""Rows/s of one rank at W = 1, 2, 3, 4 and 7 on one table: the step layout's cost.

Issue #18 asks that "any world size" costs nothing where W divides S and states the W = 3
cell. Every cell reads rank 0's share of one epoch (no workers, the default reads in
flight) of the same LanceDB table with S = 48 and G = 1,536 rows a step, and prints rank
0's rows/s (median of `--reps`), its batch sizes and the ratio to W = 1. Where W divides S
the step layout gives the rows and order of the split layout (tests prove it); W = 3 is a
divisor too, W = 7 is not (per-rank batches of 219 and 220 rows, shared splits).

    .venv/bin/python benchmarks/any_world.py [--rows 400000] [--reps 3] [--baseline DIR]

`--baseline DIR` runs the divisor cells again with the loader found in DIR (a checkout of
an older commit, e.g. made with `git worktree add /tmp/before 4d4e16c`), in the same
process tree, for the before/after ratio: that code knows `batch_size=` only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from string import Template

SPLITS, GLOBAL = 48, 1536
WORLDS = (1, 2, 3, 4, 7)


def make_table(folder: Path, rows: int) -> str:
    import lancedb
    import numpy as np
    import pyarrow as pa

    db = lancedb.connect(str(folder))
    ids = np.arange(rows, dtype=np.int64)
    x = np.random.default_rng(0).standard_normal((rows, 32), np.float32)
    table = pa.table(
        {"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 32)}
    )
    db.create_table("rows", table, mode="overwrite")
    return str(folder)


CELL = """
import json, sys, time
import lancedb
from loader import StreamingDataLoader, StreamingDataset
db, world, use_global = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
table = lancedb.connect(db).open_table("rows")
ds = StreamingDataset(table, num_splits=$splits, shuffle_seed=1, shuffle_clump_size=64,
                      rank=0, world_size=world)
sizes = {"global_batch_size": $batch} if use_global else {"batch_size": $batch // world}
dl = StreamingDataLoader(ds, **sizes)
next(iter(StreamingDataLoader(ds, **sizes)))  # warm: kernels, the table's first read
ds.set_epoch(1)
start, rows, batch_rows = time.perf_counter(), 0, set()
for batch in dl:
    rows += len(batch["id"])
    batch_rows.add(len(batch["id"]))
print(json.dumps({"rows": rows, "s": time.perf_counter() - start, "sizes": sorted(batch_rows)}))
"""
CELL = Template(CELL).substitute(splits=SPLITS, batch=GLOBAL)


def cell(db: str, world: int, code: str | None, use_global: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=code or str(Path(__file__).resolve().parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", CELL, db, str(world), "1" if use_global else "0"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--baseline", default=None, help="a folder holding an older loader/")
    args = p.parse_args()
    now: dict[int, list[float]] = {w: [] for w in WORLDS}
    before: dict[int, list[float]] = {w: [] for w in WORLDS if SPLITS % w == 0}
    with tempfile.TemporaryDirectory() as tmp:
        db = make_table(Path(tmp) / "db", args.rows)
        for _ in range(args.reps):  # interleaved, so a noisy stretch hits every cell alike
            for world in WORLDS:
                got = cell(db, world, None, True)
                now[world].append(got["rows"] / got["s"])
                if args.baseline and world in before:
                    old = cell(db, world, args.baseline, False)
                    before[world].append(old["rows"] / old["s"])
    print(f"rows {args.rows:,}, S = {SPLITS}, G = {GLOBAL}, rank 0, w = 0, medians of {args.reps}")
    print(
        f"{'W':>3}  {'batch rows':>10}  {'rows/s now':>11}  {'÷ W=1':>6}  {'before':>11}  {'now ÷ before':>12}"
    )
    first = statistics.median(now[1])
    for world in WORLDS:
        mid = statistics.median(now[world])
        old = statistics.median(before[world]) if before.get(world) else None
        batch = f"{GLOBAL // world}" + (f"-{GLOBAL // world + 1}" if GLOBAL % world else "")
        olds = f"{old:11,.0f}" if old else f"{'-':>11}"
        ratio = f"{mid / old:12.2f}" if old else f"{'-':>12}"
        print(f"{world:>3}  {batch:>10}  {mid:11,.0f}  {mid / first:6.2f}  {olds}  {ratio}")


if __name__ == "__main__":
    main()
