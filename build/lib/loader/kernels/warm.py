"""Importing this loads every plan kernel once, on a tiny plan.

The loader's forkserver preloads it, so each DataLoader worker forks from a process that
already has the kernels in memory instead of loading Numba's cache itself (~0.45 s per
fresh worker, every epoch without persistent workers). Runs the same calls the reader
makes, so the compiled signatures are the ones the workers need.
"""

from __future__ import annotations

from loader.plan import PlanSpec
from loader.stream import Batching, rank_stream, task_order_indices


def warm_kernels() -> None:
    plan = PlanSpec(num_rows=8, num_splits=2, shuffle=True, shuffle_seed=1, clump_size=2)
    epoch = plan.epoch(0)
    for batching in (Batching(1, False), Batching(None, False, 2)):  # both layouts
        stream = rank_stream(0, (1, 0), plan.rows_per_split, 0, 1, batching)
        epoch.order(task_order_indices(stream.task(1), plan.rows_per_split))
        stream.cursors_after(2)
    epoch.order_range(0, 4)


warm_kernels()
