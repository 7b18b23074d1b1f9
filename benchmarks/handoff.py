"""The worker hand-off's cost in the main process, per batch (issue #21 item 3).

A synthetic dataset makes, in DataLoader workers, reads of PER batches of 1024 rows (`x`
float32[128], `id`, `label` int64: 528 B a row) and hands them to the main process three ways:
a list of batch dicts (before), one `SlicedRead` with a tensor per column, and one
`SlicedRead` whose columns share one storage (what `convert.table_to_batch` makes now).
Main-process CPU time per batch received (`time.process_time`, so the workers' own work is
left out) and wall time per batch; medians of 3, each a fresh DataLoader.

    PYTHONPATH=. .venv/bin/python benchmarks/handoff.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from loader.read.reader import SlicedRead, cut_columns

ROWS, WORKERS = 1024, 2
KINDS = ("list of dicts", "SlicedRead", "SlicedRead, one storage")


class Reads(Dataset[Any]):
    def __init__(self, per: int, kind: str) -> None:
        self.per, self.kind = per, kind

    def __getitem__(self, index: int) -> Any:
        n = ROWS * self.per
        if self.kind == KINDS[2]:
            buf = torch.empty(n * 528, dtype=torch.uint8)
            whole = {
                "x": buf[: n * 512].view(torch.float32).view(n, 128),
                "id": buf[n * 512 : n * 520].view(torch.int64),
                "label": buf[n * 520 :].view(torch.int64),
            }
            whole["x"].fill_(1.0)
            whole["id"].copy_(torch.arange(n))
            whole["label"].copy_(torch.arange(n))
        else:
            whole = {"x": torch.ones((n, 128)), "id": torch.arange(n), "label": torch.arange(n)}
        read = SlicedRead(whole, list(range(0, n + 1, ROWS)), cut_columns)
        return list(read) if self.kind == KINDS[0] else read

    def __len__(self) -> int:
        return 1 << 30


class Forever(Sampler[int]):
    def __iter__(self) -> Any:
        return iter(range(1 << 30))


def per_batch(per: int, kind: str, seconds: float = 3.0) -> tuple[float, float]:
    """(main-process CPU, wall) microseconds per batch."""
    loader = DataLoader(
        Reads(per, kind), batch_size=None, sampler=Forever(), num_workers=WORKERS,
        collate_fn=lambda read: read, multiprocessing_context="fork",
    )  # fmt: skip
    reads = iter(loader)
    next(reads)
    batches, start, cpu = 0, time.perf_counter(), time.process_time()
    for read in reads:
        batches += sum(1 for _ in read)
        if time.perf_counter() - start > seconds:
            break
    wall = (time.perf_counter() - start) / batches * 1e6
    return (time.process_time() - cpu) / batches * 1e6, wall


def main() -> None:
    figures: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for _ in range(3):
        for per in (1, 8):
            for kind in KINDS:
                figures.setdefault((per, kind), []).append(per_batch(per, kind))
    print(
        "| batches a read | handed off as | main-process CPU per batch (µs) | wall per batch (µs) |"
    )
    print("|---|---|---|---|")
    for (per, kind), runs in figures.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"| {per} | {kind} | {cpu:.0f} | {wall:.0f} |")


if __name__ == "__main__":
    main()
