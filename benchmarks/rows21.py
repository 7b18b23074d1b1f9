"""Issue #21's rows figures in one run: ours ÷ lance.torch+ShardedBatchSampler at w = 0, 2 and
W = 1, 2, ours ÷ a raw Lance take of ours' own reads (the ceiling for this order), and ours
before this issue's changes (`--base`: a checkout of the loader package, e.g. made with
`git archive <commit> loader | tar -x -C DIR`) beside ours now, on the same table.

    PYTHONPATH=.:benchmarks/stubs:benchmarks benchmarks/.venv/bin/python benchmarks/rows21.py \\
        --reps 3 [--base DIR]

Each measurement is a fresh process (`run.launch`, `readers.py`'s cases: S = 48, C = 1024,
b = 1024, 1M rows or `--max-seconds` a rank); repetitions shuffle the matrix; ratios are
taken within a repetition (median, range).
"""

from __future__ import annotations

import argparse
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import run
from common import Case, median

BASE = "ours_base"  # ours, run with the --base checkout first on the path


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})" if values else "–"


def launch(name: str, w: int, ws: int, seconds: float, base: str | None) -> float:
    loader = "ours" if name == BASE else name
    case = Case(loader=loader, num_workers=w, world_size=ws, max_seconds=seconds)
    threads = run.env_threads
    if name == BASE:
        assert base is not None
        own = threads()
        run.env_threads = lambda: own | {"PYTHONPATH": os.pathsep.join([base, own["PYTHONPATH"]])}
    try:
        rec = run.launch(case)
    finally:
        run.env_threads = threads
    if "error" in rec:
        raise RuntimeError(f"{name} w={w} W={ws}: {rec['error']}")
    print(f"  {name:16s} w={w} W={ws} {rec['rows_per_s']:>12,.0f} rows/s", flush=True)
    return float(rec["rows_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=4.0)
    ap.add_argument("--base", help="a directory holding the loader package to compare with")
    ap.add_argument("--replay", help="a log of this script: print its table, measure nothing")
    args = ap.parse_args()
    matrix = [(n, w, ws) for n in ("ours", "lance_torch") for w in (0, 2) for ws in (1, 2)]
    # raw reads and the old checkout without workers (its forkserver workers would import
    # this checkout's loader: the run's PYTHONPATH does not reach them)
    matrix += [(n, 0, ws) for n in ["raw_take_reads"] + [BASE] * bool(args.base) for ws in (1, 2)]
    rates: dict[tuple[str, int, int], list[float]] = {}
    if args.replay:  # the table again from a run's printed measurements
        for line in Path(args.replay).read_text().splitlines():
            if m := re.fullmatch(r"  (\w+) +w=(\d) W=(\d) +([\d,]+) rows/s", line):
                key = (m[1], int(m[2]), int(m[3]))
                rates.setdefault(key, []).append(float(m[4].replace(",", "")))
    for rep in range(0 if args.replay else args.reps):
        for name, w, ws in random.Random(210 + rep).sample(matrix, len(matrix)):
            rates.setdefault((name, w, ws), []).append(
                launch(name, w, ws, args.max_seconds, args.base)
            )

    def ratio(a: tuple[str, int, int], b: tuple[str, int, int]) -> str:
        return spread(list(np.divide(rates[a], rates[b])))

    lines = [
        "| figure | w=0 W=1 | w=2 W=1 | w=0 W=2 | w=2 W=2 | target |",
        "|---|---|---|---|---|---|",
    ]
    cells = [(0, 1), (2, 1), (0, 2), (2, 2)]
    rows: list[tuple[str, Any, str]] = [
        ("ours ÷ lance.torch + ShardedBatchSampler", lambda w, ws: ratio(("ours", w, ws), ("lance_torch", w, ws)), "≥ 1.2 (w = 0)"),
        ("ours ÷ raw Lance take of ours' own reads (w = 0 raw)", lambda w, ws: ratio(("ours", w, ws), ("raw_take_reads", 0, ws)), "≥ 0.9"),
        ("ours with w = 2 ÷ ours with w = 0", lambda w, ws: ratio(("ours", 2, ws), ("ours", 0, ws)) if w == 2 else "–", "info"),
    ]  # fmt: skip
    if args.base:
        before = lambda w, ws: ratio(("ours", w, ws), (BASE, w, ws)) if w == 0 else "–"  # noqa: E731
        rows.append(("ours now ÷ ours before (w = 0)", before, "info"))
    for title, cell, target in rows:
        lines.append(
            f"| {title} | " + " | ".join(cell(w, ws) for w, ws in cells) + f" | {target} |"
        )
    lines += ["", "| reader | w | W | rows/s (median) |", "|---|---|---|---|"]
    for (name, w, ws), values in sorted(rates.items()):
        lines.append(f"| {name} | {w} | {ws} | {median(values):,.0f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
