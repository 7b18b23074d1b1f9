"""The main job's closing summary: one table a reader can paste into an issue.

Kept apart from the driver so the driver reads as the experiment and this file as its
presentation; nothing here runs training or touches torch. Run it to print the table
again from a run's saved summary:

    python examples/main_job.py --summary-json /tmp/main-job.json
    python examples/job_report.py /tmp/main-job.json
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

COLUMN = 16
HARSH_NOTE = (
    "   Speed-up = time(W=1) / time(W); efficiency = speed-up / W. A harsh test here: each\n"
    "   rank gets max(1, {cores} // W) CPU threads, so W=1 already uses all {cores} core(s) and\n"
    "   1.0x is the best any W can do; W=4 puts 4 ranks on {cores} core(s); and every step\n"
    "   all-reduces 6.5 MB of float32 gradients over loopback. What the table shows is the\n"
    "   cost of splitting a step; with a core (or a GPU) per rank, larger global batches give\n"
    "   each rank more compute per exchange, which is what makes data parallelism pay."
)


def _row(label: str, cells: list[str]) -> str:
    return f"   {label:<24}" + "".join(f"{c:<{COLUMN}}" for c in cells).rstrip()


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def _same_lines(same: dict[str, Any], strict: bool) -> list[str]:
    runs = same["runs"]
    worlds = sorted(runs, key=int)
    verdict = f"(≤ 1e-9: {_yes(same['max_delta'] <= 1e-9)})" if strict else "(float32 rounding)"
    return [
        "1. Same training, split across ranks",
        _row("", [f"W={w}" for w in worlds]),
        _row("test accuracy", [f"{runs[w]['accuracy']:.2%}" for w in worlds]),
        _row("replicas differ by", [f"{runs[w]['replica_spread']:.1e}" for w in worlds]),
        _row("training time", [f"{runs[w]['seconds']:.1f} s" for w in worlds]),
        _row("max |Δweight| runs", [f"{same['max_delta']:.1e}", verdict]),
    ]


def _crash_lines(crash: dict[str, Any], strict: bool) -> list[str]:
    resumed = crash["resumed"]
    epochs = resumed["rows_per_epoch"]
    counts = ", ".join(str(e["distinct"]) for e in epochs)
    verdict = f"(≤ 1e-9: {_yes(crash['max_delta'] <= 1e-9)})" if strict else "(float32 rounding)"
    return [
        "2. Crash and resume elsewhere",
        _row("crash", [f"W=4, killed after step {crash['crash_at_step']}"]),
        _row(
            "resume",
            [f"W={resumed['world_size']} from checkpoint at step {crash['resumed_from_step']}"],
        ),
        _row("distinct rows / epoch", [counts]),
        _row("each row exactly once", [_yes(crash["exactly_once"])]),
        _row("test accuracy", [f"{resumed['accuracy']:.2%}"]),
        _row("max |Δweight| vs W=4", [f"{crash['max_delta']:.1e}", verdict]),
    ]


def _speed_lines(speed: dict[str, Any]) -> list[str]:
    seconds = speed["seconds"]
    lines = [f"3. Speed-up and efficiency (float32, {speed['epochs']} epochs per run)"]
    for batch, times in seconds.items():
        worlds = sorted(times, key=int)
        base = times[worlds[0]]
        cells = [f"{base:.1f} s"] + [
            f"{base / times[w]:.2f}x ({base / times[w] / int(w):.0%})" for w in worlds[1:]
        ]
        if batch == next(iter(seconds)):
            lines.append(_row("", [f"W={w}" for w in worlds]))
        lines.append(_row(f"global batch {batch}", cells))
    lines.append(HARSH_NOTE.format(cores=os.cpu_count()))
    return lines


def print_summary(summary: dict[str, Any], base: Any, dashboard_url: str | None) -> None:
    """Print the table; ``base`` is the TrainConfig of parts 1 and 2."""
    strict = base.dtype == "float64"
    print(
        f"\nSummary: {base.epochs} epochs, global batch {base.global_batch}, num_splits "
        f"{base.num_splits}, SGD lr {base.lr}, {base.dtype} for parts 1-2"
    )
    blocks = []
    if "same" in summary:
        blocks.append(_same_lines(summary["same"], strict))
    if "crash" in summary:
        blocks.append(_crash_lines(summary["crash"], strict))
    if "speed" in summary:
        blocks.append(_speed_lines(summary["speed"]))
    for block in blocks:
        print("\n".join(block))
    problems = summary.get("problems") or []
    print("Result: " + ("; ".join(problems) if problems else "every check passed"))
    if dashboard_url:
        print(f"Dashboard: {dashboard_url}")


def saved_config(summary: dict[str, Any]) -> SimpleNamespace:
    """The TrainConfig of parts 1 and 2, as each run's result saved it."""
    runs = list(summary.get("same", {}).get("runs", {}).values())
    if "crash" in summary:
        runs.append(summary["crash"]["resumed"])
    if not runs:
        raise SystemExit("the summary holds no run of part 1 or 2 (--parts 3 alone?)")
    return SimpleNamespace(**runs[0]["config"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("summary_json", type=Path, help="what main_job.py --summary-json wrote")
    summary = json.loads(p.parse_args(argv).summary_json.read_text())
    print_summary(summary, saved_config(summary), None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
