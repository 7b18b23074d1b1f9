"""Issue #27 / #24 item 18: what a mixture's step costs beyond its reads.

- plan: the Python and kernel time of `MixStream.tasks` over one epoch of the `mixture.py`
  benchmark's mixture (3 tables at 6:3:1, G = 1,024), per step, best of 7;
- tiny: seconds a step of a 200,000-row table mixed 1:1 with a table of N rows (N = 1, 100,
  100,000), G = 32,768, read_size = G, no workers (3 steps after the first): a dataset that
  repeats thousands of times inside a step must cost no Python per pass.

    PYTHONPATH=$PWD benchmarks/.venv/bin/python benchmarks/mixture_steps.py
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mixture


def plan_cost() -> float:
    from loader.progress import Batching

    mix = mixture.ours_mixture(0).streaming_dataset
    best = float("inf")
    for _ in range(7):
        stream = mix.progress.peek(Batching(None, False, mixture.BATCH))
        start = time.process_time()
        for _ in stream.tasks(8):
            pass
        best = min(best, (time.process_time() - start) / stream.num_batches)
    return best


def tiny_step(rows: int, g: int = 32_768, steps: int = 3) -> float:
    from loader import MixedDataset, StreamingDataLoader, StreamingDataset

    big = pa.table({"id": list(range(10**6, 10**6 + 200_000))})
    a = StreamingDataset(big, num_splits=4, shuffle_seed=1)
    b = StreamingDataset(pa.table({"id": list(range(rows))}), num_splits=1, shuffle_seed=2)
    mix = MixedDataset([a, b], [1, 1])
    loader = StreamingDataLoader(mix, global_batch_size=g, reads_in_flight=0, read_size=g)
    batches = iter(loader)
    next(batches)
    start = time.perf_counter()
    for _ in range(steps):
        next(batches)
    return (time.perf_counter() - start) / steps


def main() -> None:
    mixture.build(litdata=False)
    warnings.simplefilter("ignore")  # num_splits=1 for the tiny table is meant
    print(f"plan: {plan_cost() * 1e6:.1f} us a step (best of 7)")
    for rows in (1, 100, 100_000):
        print(f"tiny: N={rows:<7} {tiny_step(rows):.3f} s a step")


if __name__ == "__main__":
    main()
