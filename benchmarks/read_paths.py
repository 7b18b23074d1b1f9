"""Where ours' read time goes: read strategies on exactly the batches ours yields.

Same plan (S = 48, C = 1024, b = 1024, rank 0 of 1), same rows, same order, tensors out,
one thread: only the way the rows are fetched from Lance changes. ``per_batch`` is what
the loader did until commit 5164402 (one ``take`` per batch: 48 runs of ~21 rows each);
``coalesce_m`` reads m consecutive batches in one sorted ``take`` (NumPy indices), gathers
each column once, and hands out slices: what it does since (``read_size=8192``, m = 8).
``pa_indices`` is ``per_batch`` with the positions passed as a ``pa.array``, as it was.

    benchmarks/.venv/bin/python benchmarks/read_paths.py [--batches 960] [--splits 48]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from common import COLUMNS, Case, lance_path
from readers import batch_positions


def _columns(table: pa.Table, order: np.ndarray) -> dict[str, torch.Tensor]:
    """Each column gathered into ``order`` once (fixed-size lists as 2-D)."""
    out = {}
    for name in table.column_names:
        arr = table[name].combine_chunks()
        if pa.types.is_fixed_size_list(arr.type):
            values = arr.flatten().to_numpy().reshape(len(arr), arr.type.list_size)
        else:
            values = arr.to_numpy()
        out[name] = torch.from_numpy(values[order])
    return out


def _read(ds: Any, group: list[np.ndarray], as_arrow: bool) -> Iterator[dict[str, Any]]:
    """One sorted take for the group, then one batch per member in stream order."""
    wanted = np.concatenate(group)
    ascending = np.argsort(wanted, kind="stable")
    indices = wanted[ascending]
    table = ds.take(pa.array(indices) if as_arrow else indices, columns=list(COLUMNS))
    restore = np.empty_like(ascending)
    restore[ascending] = np.arange(len(ascending))
    cols = _columns(table, restore)
    start = 0
    for member in group:
        yield {k: v[start : start + len(member)] for k, v in cols.items()}
        start += len(member)


def _strategy(m: int, as_arrow: bool = False) -> Callable[[Any, list[np.ndarray]], Iterator]:
    def run(ds: Any, batches: list[np.ndarray]) -> Iterator[dict[str, Any]]:
        for g in range(0, len(batches), m):
            yield from _read(ds, batches[g : g + m], as_arrow)

    return run


STRATEGIES = {
    "per_batch": _strategy(1),
    "pa_indices": _strategy(1, as_arrow=True),
    "coalesce_8": _strategy(8),
    "coalesce_48": _strategy(48),
}


def measure(batches: int, splits: int, reps: int) -> dict[str, list[float]]:
    """Rows/s of each strategy, ``reps`` times, strategies interleaved."""
    import lance

    case = Case(loader="ours", num_splits=splits, max_rows=batches * 1024)
    wanted = batch_positions(case)[:batches]
    ds = lance.dataset(lance_path())
    out: dict[str, list[float]] = {name: [] for name in STRATEGIES}
    for _ in range(reps):
        for name, run in STRATEGIES.items():
            t0 = time.perf_counter()
            rows = sum(len(b["id"]) for b in run(ds, wanted))
            out[name].append(rows / (time.perf_counter() - t0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=960)
    ap.add_argument("--splits", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"| read strategy (S={args.splits}) | rows/s (median of {args.reps}) |\n|---|---|")
    for name, rates in measure(args.batches, args.splits, args.reps).items():
        print(f"| {name} | {np.median(rates):,.0f} |")


if __name__ == "__main__":
    main()
