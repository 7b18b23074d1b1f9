"""Turn ``benchmarks/out/results.jsonl`` into issue #5's ratio table and a plot of rows/s.

Ratios are taken within each repetition (loaders measured minutes apart in the same run)
and the median over repetitions is reported, with the repetitions' range beside it.

    benchmarks/.venv/bin/python benchmarks/report.py [--run RUN_ID]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Callable

from common import OUT, median

Key = tuple[str, int, int]  # (loader, num_workers, world_size)
CONFIGS = ((0, 1), (2, 1), (0, 2), (2, 2))  # (num_workers, world_size)

# (what, ours, versus, goal): versus with workers "raw" is read at w = 0 (raw reads do not
# use DataLoader workers); goal > 0 is a floor on ours/versus.
TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("ours / raw take, same rows and batches", "ours", "raw_take", 0.9),
    ("ours / raw take of ours' own reads (8 batches a take)", "ours", "raw_take_reads", 0.0),
    ("ours / raw take, one clump per batch", "ours", "raw_take_clumps", 0.0),
    ("ours / lancedb.streaming (C=1024, rbs=1024)", "ours", "lancedb_streaming", 30.0),
    ("ours / LitData", "ours", "litdata", 1.0),
    ("ours / mosaicml-streaming", "ours", "mosaic", 1.0),
    ("ours / lance.torch + ShardedBatchSampler", "ours", "lance_torch", 1.0),
    ("C=1: ours / raw random take", "ours_random", "raw_random", 0.9),
    ("S=2: ours / raw take, same rows and batches", "ours_s2", "raw_take_s2", 0.0),
)
RAW = (
    "raw_take",
    "raw_take_reads",
    "raw_take_threads",
    "raw_take_clumps",
    "raw_range",
    "raw_random",
    "raw_take_s2",
)


def load(run: str | None) -> list[dict]:
    """Records of one run (default: the latest) without failures."""
    records = [json.loads(line) for line in (OUT / "results.jsonl").read_text().splitlines()]
    run = run or records[-1]["run"]
    return [r for r in records if r["run"] == run]


def _key(rec: dict) -> Key:
    case = rec["case"]
    return case["loader"], case["num_workers"], case["world_size"]


def by_rep(records: list[dict], field: Callable[[dict], float]) -> dict[Key, dict[int, float]]:
    out: dict[Key, dict[int, float]] = defaultdict(dict)
    for rec in records:
        if "error" not in rec:
            out[_key(rec)][rec["rep"]] = field(rec)
    return out


def ratio(values: dict[Key, dict[int, float]], a: Key, b: Key) -> tuple[float, float, float]:
    """Median and range over repetitions of a/b, each repetition with its own pair."""
    reps = sorted(set(values.get(a, {})) & set(values.get(b, {})))
    rs = [values[a][r] / values[b][r] for r in reps if values[b][r] > 0]
    return (median(rs), min(rs), max(rs)) if rs else (float("nan"),) * 3


def _versus(name: str, workers: int) -> int:
    return 0 if name in RAW else workers


def target_lines(records: list[dict]) -> list[str]:
    rate = by_rep(records, lambda r: r["rows_per_s"])
    lines = [
        "| target | w=0 W=1 | w=2 W=1 | w=0 W=2 | w=2 W=2 | goal |",
        "|---|---|---|---|---|---|",
    ]
    for what, ours, versus, goal in TARGETS:
        cells = []
        for w, ws in CONFIGS:
            mid, lo, hi = ratio(rate, (ours, w, ws), (versus, _versus(versus, w), ws))
            cells.append("–" if mid != mid else f"{mid:.2f} ({lo:.2f}–{hi:.2f})")
        lines.append(
            f"| {what} | " + " | ".join(cells) + f" | {f'≥ {goal:g}' if goal else 'info'} |"
        )
    first = by_rep(records, lambda r: r["first_batch_s"])
    fresh = by_rep(records, lambda r: r["extra"].get("fresh_first_batch_s", float("nan")))
    for name in ("ours_resume", "mosaic_resume"):
        cells = []
        for w, ws in CONFIGS:
            reps = first.get((name, w, ws), {})
            rs = [reps[r] / fresh[(name, w, ws)][r] for r in reps]
            cells.append(f"{median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})" if rs else "–")
        goal = "≤ 1.1" if name == "ours_resume" else "info"
        lines.append(
            f"| {name}: first batch resumed at 90 % / fresh | " + " | ".join(cells) + f" | {goal} |"
        )
    return lines


def loader_lines(records: list[dict]) -> list[str]:
    """Per loader and configuration: medians of rows/s, first batch, peak memory."""
    fields = {
        "rows_per_s": lambda r: r["rows_per_s"],
        "first": lambda r: r["first_batch_s"],
        "process_first": lambda r: r["process_first_batch_s"],
        "rss": lambda r: r["peak_rss_mib"],
        "worker_rss": lambda r: r["worker_peak_rss_mib"],
    }
    med = {
        name: {k: median(v.values()) for k, v in by_rep(records, f).items()}
        for name, f in fields.items()
    }
    lines = [
        "| loader | w | W | rows/s | first batch (s) | fresh process to first batch (s) | peak RSS main / worker (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(med["rows_per_s"], key=lambda k: (k[2], k[1], -med["rows_per_s"][k])):
        name, w, ws = key
        lines.append(
            f"| {name} | {w} | {ws} | {med['rows_per_s'][key]:,.0f} | {med['first'][key]:.3f} "
            f"| {med['process_first'][key]:.2f} | {med['rss'][key]:.0f} / {med['worker_rss'][key]:.0f} |"
        )
    return lines


def plot(records: list[dict], path: str) -> None:
    """Rows/s per loader (log scale), one panel per (workers, world size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate = {k: median(v.values()) for k, v in by_rep(records, lambda r: r["rows_per_s"]).items()}
    fig, axes = plt.subplots(1, len(CONFIGS), figsize=(18, 5.5), sharex=True)
    for ax, (w, ws) in zip(axes, CONFIGS, strict=True):
        keys = [k for k in rate if k[2] == ws and (k[1] == w or (k[0] in RAW and k[1] == 0))]
        keys = [k for k in keys if not k[0].endswith("_resume")]
        keys.sort(key=lambda k: rate[k])
        colors = [
            "tab:green" if k[0].startswith("ours") else "tab:gray" if k[0] in RAW else "tab:blue"
            for k in keys
        ]
        bars = ax.barh([k[0] for k in keys], [rate[k] for k in keys], color=colors)
        ax.bar_label(bars, labels=[f"{rate[k]:,.0f}" for k in keys], fontsize=7, padding=2)
        ax.set_xscale("log")
        ax.set_xlim(min(rate.values()) / 2, max(rate.values()) * 8)  # room for the labels
        ax.set_title(f"num_workers={w}, world size {ws}")
        ax.set_xlabel("rows/s (median; raw reads use no workers)")
    fig.suptitle("elastic-loader vs raw Lance and peers: 2M rows x 528 B, clump 1024, batch 1024")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(run: str | None) -> str:
    records = load(run)
    errors = [f"- {_key(r)} rep {r['rep']}: {r['error']}" for r in records if "error" in r]
    text = "\n".join(
        [f"run {records[0]['run']}", "", *target_lines(records), "", *loader_lines(records)]
        + (["", "errors:", *errors] if errors else [])
    )
    plot(records, str(OUT / "rows_per_s.png"))
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="run id in results.jsonl (default: the latest)")
    print(report(ap.parse_args().run))


if __name__ == "__main__":
    main()
