"""Issue #2's plan benchmark: one rank's epoch positions, and time to its first batch.

For N rows, S = 48 splits, W = 8 ranks and C in {1, 64, 1024}: the wall time to compute
all of rank 0's positions (``EpochPlan.rank_rows``) cold (first call in a fresh process,
kernels loaded from Numba's on-disk cache) and warm (after that), and the peak extra memory
(peak RSS over the RSS before the call). Beside it: ``numpy.random.default_rng(seed)
.permutation(N)`` and mosaicml-streaming's ``get_shuffle`` (py1e and py1s; 64 canonical
nodes, block 2^18 and shards of 2^17 samples as its defaults give for one node), which
produces the whole epoch that every rank then slices. Each measurement is its own process.
Time to first batch is the plan's share of it: rank 0's first batch of 1024 rows
(``rank_stream(...).task`` + ``EpochPlan.order``) for N up to 1B.

    benchmarks/.venv/bin/python benchmarks/plan.py [--big]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

S, W, RANK, SEED, BATCH = 48, 8, 0, 0, 1024
SHARD, BLOCK, CANONICAL = 1 << 17, 1 << 18, 64  # mosaic's defaults on one node
HERE = Path(__file__).resolve().parent


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def ours(n: int, clump: int) -> Callable[[], object]:
    from loader.plan import PlanSpec

    spec = PlanSpec(n, S, True, SEED, clump)
    return lambda: spec.epoch(0).rank_rows(RANK, W)


def numpy_permutation(n: int, clump: int) -> Callable[[], object]:
    return lambda: np.random.default_rng(SEED).permutation(n)


def _mosaic(algo: str) -> Callable[[int, int], Callable[[], object]]:
    def make(n: int, clump: int) -> Callable[[], object]:
        from streaming.base.shuffle import get_shuffle

        sizes = np.full(-(-n // SHARD), SHARD, dtype=np.int64)
        sizes[-1] = n - SHARD * (len(sizes) - 1)
        return lambda: get_shuffle(algo, sizes, CANONICAL, SEED, 0, BLOCK)

    return make


def ours_first_batch(n: int, clump: int) -> Callable[[], object]:
    """The plan's part of rank 0's first batch: its task, then those rows' positions."""
    from loader.plan import PlanSpec
    from loader.stream import Batching, rank_stream, task_order_indices

    spec = PlanSpec(n, S, True, SEED, clump)

    def first() -> object:
        stream = rank_stream(0, (0,) * S, spec.rows_per_split, RANK, W, Batching(BATCH, False))
        task = stream.task(0)
        return spec.epoch(0).order(task_order_indices(task, spec.rows_per_split))

    return first


PLANS: dict[str, Callable[[int, int], Callable[[], object]]] = {
    "ours": ours,
    "ours_first_batch": ours_first_batch,
    "numpy_permutation": numpy_permutation,
    "mosaic_py1e": _mosaic("py1e"),
    "mosaic_py1s": _mosaic("py1s"),
}


def measure(name: str, n: int, clump: int, cold: bool) -> dict:
    """In this fresh process: the cold call, or the warm calls and their peak extra memory.

    Cold is the first call, Numba kernels loaded from the on-disk cache. Warm first runs the
    plan once on a small N (loading kernels and libraries), then measures the peak RSS of
    one full call over the RSS before it, then the median time of 3 calls (1 above N = 10M).
    """
    if cold:
        call = PLANS[name](n, clump)
        t0 = time.perf_counter()
        call()
        return {"cold_s": time.perf_counter() - t0}
    PLANS[name](max(S, min(n, 1 << 16)), clump)()
    call = PLANS[name](n, clump)
    before = _rss_mib()
    call()
    extra = max(0.0, _peak_mib() - before)
    warm = []
    for _ in range(3 if n <= 10_000_000 else 1):
        t0 = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t0)
    return {"warm_s": float(np.median(warm)), "extra_mib": extra}


def _run(mode: str, name: str, n: int, clump: int, timeout: float) -> dict:
    args = [sys.executable, __file__, mode, name, str(n), str(clump)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"error": done.stderr.strip()[-300:]}
    return json.loads(lines[-1])


def run_one(name: str, n: int, clump: int, timeout: float = 900.0) -> dict:
    """Cold and warm figures of one plan, each from its own fresh process."""
    out = {"name": name, "n": n, "clump": clump}
    return out | _run("--cold", name, n, clump, timeout) | _run("--warm", name, n, clump, timeout)


def matrix(big: bool) -> list[tuple[str, int, int]]:
    sizes = (10_000_000, 100_000_000)
    rows = [("ours", n, c) for n in sizes for c in (1, 64, 1024)]
    rows += [("numpy_permutation", n, 1) for n in sizes]
    rows += [(algo, n, 1) for algo in ("mosaic_py1e", "mosaic_py1s") for n in sizes]
    first = (10_000_000, 100_000_000, 1_000_000_000) + ((10_000_000_000,) if big else ())
    rows += [("ours_first_batch", n, c) for n in first for c in (1, 1024)]
    return rows


def table(results: list[dict]) -> str:
    lines = [
        f"S = {S}, W = {W}, rank {RANK}: all of its N/{W} positions (first batch: {BATCH} rows)",
        "",
        "| plan | N | C | cold (s) | warm (s) | peak extra memory (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['n']:,} | {r['clump']} | error: {r['error']} | | |")
            continue
        lines.append(
            f"| {r['name']} | {r['n']:,} | {r['clump']} | {r['cold_s']:.4f} | {r['warm_s']:.4f} "
            f"| {r['extra_mib']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", nargs=3, metavar=("PLAN", "N", "C"), help="measure one, here")
    ap.add_argument("--warm", nargs=3, metavar=("PLAN", "N", "C"), help="measure one, here")
    ap.add_argument("--big", action="store_true", help="also N = 10B for the first batch")
    args = ap.parse_args()
    if args.cold or args.warm:
        name, n, clump = args.cold or args.warm
        print(json.dumps(measure(name, int(n), int(clump), cold=bool(args.cold))))
        return
    results = [run_one(*m) for m in matrix(args.big)]
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "plan.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    print(table(results))


if __name__ == "__main__":
    main()
