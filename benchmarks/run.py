"""Run every loader side by side, repeated and interleaved, then print and plot the results.

Each measurement is a fresh process (``measure.py``); a 2-rank case is two processes in
one Gloo group, whose rows add up and whose slower rank sets the time. Repetitions go
round the whole matrix in a new order each time, so machine noise spreads over every
loader instead of landing on one. Raw results go to ``benchmarks/out/results.jsonl``;
``report.py`` turns them into the ratio table and the plot.

    benchmarks/.venv/bin/python benchmarks/run.py --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterable

from common import HERE, OUT, Case, env_threads

# (loader, num_workers, world_size): raw reads do not use workers; peers too slow to gain
# anything from more processes are measured once per world size.
MATRIX: tuple[tuple[str, int, int], ...] = (
    *((n, 0, 1) for n in ("raw_take", "raw_take_reads", "raw_take_clumps", "raw_range")),
    *((n, 0, 2) for n in ("raw_take", "raw_take_reads", "raw_take_clumps")),
    ("raw_random", 0, 1),
    ("raw_take_s2", 0, 1),
    ("ours_s2", 0, 1),
    *(
        (name, w, ws)
        for name in ("ours", "lancedb_streaming", "litdata", "mosaic", "lance_torch")
        for w in (0, 2)
        for ws in (1, 2)
    ),
    ("ours_random", 0, 1),
    ("ours_random", 2, 1),
    ("lancedb_streaming_default", 0, 1),
    ("ours_resume", 0, 1),
    ("ours_resume", 2, 1),
    ("mosaic_resume", 0, 1),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env(case: Case) -> dict[str, str]:
    """What torchrun sets for each rank on one node (mosaic reads the LOCAL_ ones)."""
    rank, size = str(case.rank), str(case.world_size)
    return {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": size}


def launch(case: Case, timeout: float = 300.0) -> dict:
    """Run ``case`` on all its ranks at once; merge them into one record."""
    env = env_threads() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    script = str(HERE / "measure.py")
    started_at = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, script, json.dumps(dataclasses.asdict(rank_case))],
            env=env | _torchrun_env(rank_case),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank_case in (dataclasses.replace(case, rank=r) for r in range(case.world_size))
    ]
    ranks, errors = [], []
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=timeout)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if lines:
            ranks.append(json.loads(lines[-1]))
        else:
            errors.append(f"rank {rank}: " + " | ".join(err.strip().splitlines()[-3:]))
    if errors:
        return {"case": dataclasses.asdict(case), "error": " ;; ".join(errors)}
    return merge(case, ranks, started_at)


def merge(case: Case, ranks: list[dict], started_at: float) -> dict:
    """One record for all ranks: rows add up, the slowest rank sets time and latency."""
    seconds = max(r["seconds"] for r in ranks)
    rows = sum(r["rows"] for r in ranks)
    return {
        "case": dataclasses.asdict(case),
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds if seconds > 0 else 0.0,
        "first_batch_s": max(r["first_batch_s"] for r in ranks),
        "process_first_batch_s": max(r["first_batch_at"] for r in ranks) - started_at,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in ranks),
        "worker_peak_rss_mib": max(r["worker_peak_rss_mib"] for r in ranks),
        "extra": ranks[0].get("extra", {}),
    }


def cases(matrix: Iterable[tuple[str, int, int]], max_seconds: float) -> list[Case]:
    return [
        Case(loader=name, num_workers=w, world_size=ws, max_seconds=max_seconds)
        for name, w, ws in matrix
    ]


def run(reps: int, only: list[str] | None, max_seconds: float, seed: int = 0) -> list[dict]:
    """Measure the matrix ``reps`` times, in a new order each repetition."""
    todo = cases((m for m in MATRIX if not only or m[0] in only), max_seconds)
    OUT.mkdir(parents=True, exist_ok=True)
    run_id = time.strftime("%Y%m%dT%H%M%S")
    records = []
    with (OUT / "results.jsonl").open("a") as sink:
        for rep in range(reps):
            order = random.Random(seed + rep).sample(todo, len(todo))
            for i, case in enumerate(order):
                rec = launch(case) | {"run": run_id, "rep": rep}
                records.append(rec)
                sink.write(json.dumps(rec) + "\n")
                sink.flush()
                shown = f"{rec['rows_per_s']:>12,.0f} rows/s" if "error" not in rec else "ERROR"
                print(
                    f"[rep {rep + 1}/{reps} {i + 1:2d}/{len(order)}] {case.loader:26s} "
                    f"w={case.num_workers} W={case.world_size} {shown}",
                    flush=True,
                )
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="loader names (default: all)")
    ap.add_argument("--max-seconds", type=float, default=6.0, help="per measurement")
    args = ap.parse_args()
    run(args.reps, args.only, args.max_seconds)


if __name__ == "__main__":
    main()
