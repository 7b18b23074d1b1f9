"""Issue #20: rows/s of a 3-source mixture ÷ one source of the same rows, and ÷ LitData's
CombinedStreamingDataset on the same rows (where litdata is importable).

Data (built once under benchmarks/data/mixture/, ~53 MB): three LanceDB tables of 60,000,
30,000 and 10,000 rows (id, x float32[128], label: 528 B a row, `build_data.make_batch`),
one table holding the same 100,000 rows, and LitData `optimize` output of the three.
Every loader reads --epochs epochs of those 100,000 rows in batches of 1,024, shuffled,
no workers (or --workers), in a process of its own after --warm untimed epochs (building it
not timed); the loaders take turns for --rounds rounds and each figure is the median of its
rounds (the machine is shared).

- single: StreamingDataset(100k table, S=48, clump 1024) + StreamingDataLoader(batch 1024)
- mixture: the three tables (S=16 each, clump 1024) at weights 6:3:1 (their sizes, so one
  epoch reads each once), StreamingDataLoader(global_batch_size=1024) (its default reads:
  8,192 rows per dataset, 24,576 a read, against the single table's 8,192)
- litdata: CombinedStreamingDataset(3 StreamingDatasets(shuffle=True), iterate_over_all=True)
  + litdata.StreamingDataLoader(batch_size=1024)

    PYTHONPATH=$PWD benchmarks/.venv/bin/python benchmarks/mixture.py [--rounds 5] [--workers 2]

Why a process each (as in `run.py`): a training job reads through one loader per process,
and loaders sharing one process share its C heap: how many fresh pages the next
loader's reads fault in then depends on which loader ran before it (the same mixture, 2,800
or 11,500 minor page faults an epoch). --one-process runs every measurement in this process
instead (this benchmark's method before 2026-12-02). Minor page faults an epoch are printed
with the rates.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from build_data import make_batch  # noqa: E402
from common import DATA, DIM  # noqa: E402

ROOT = DATA / "mixture"
SIZES = {"web": 60_000, "code": 30_000, "math": 10_000}
BATCH = 1024
CLUMP = 1024
SEED = 7


def _rows(name: str) -> tuple[int, int]:
    start = 0
    for other, size in SIZES.items():
        if other == name:
            return start, start + size
        start += size
    raise KeyError(name)


def _table(start: int, stop: int) -> pa.Table:
    chunks = [make_batch(s, min(s + 16384, stop), SEED) for s in range(start, stop, 16384)]
    return pa.Table.from_batches(chunks)


def _litdata_items(start: int, stop: int) -> Iterator[dict[str, Any]]:
    table = _table(start, stop)
    ids, labels = table["id"].to_numpy(), table["label"].to_numpy()
    x = table["x"].combine_chunks().values.to_numpy().reshape(-1, DIM)
    for i in range(len(ids)):
        yield {"id": int(ids[i]), "x": x[i], "label": int(labels[i])}


def build(litdata: bool) -> None:
    import lancedb

    stamp = ROOT / "built"
    if not stamp.exists():
        shutil.rmtree(ROOT, ignore_errors=True)
        db = lancedb.connect(str(ROOT / "lancedb"))
        db.create_table("all", _table(0, sum(SIZES.values())))
        for name in SIZES:
            db.create_table(name, _table(*_rows(name)))
        stamp.write_text("ok")
    if litdata and not (ROOT / "litdata.built").exists():
        from litdata import optimize

        for name in SIZES:
            start, stop = _rows(name)
            optimize(
                fn=functools.partial(_items_of, stop=stop),
                inputs=list(range(start, stop, 10_000)),
                output_dir=str(ROOT / "litdata" / name),
                chunk_bytes="64MB",
                num_workers=1,
                keep_data_ordered=True,
                verbose=False,
            )
        (ROOT / "litdata.built").write_text("ok")


def _items_of(start: int, stop: int) -> Iterator[dict[str, Any]]:
    yield from _litdata_items(start, min(start + 10_000, stop))


def ours_single(workers: int) -> Any:
    import lancedb

    from loader import StreamingDataLoader, StreamingDataset

    table = lancedb.connect(str(ROOT / "lancedb")).open_table("all")
    ds = StreamingDataset(table, num_splits=48, shuffle_seed=SEED, shuffle_clump_size=CLUMP)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)


def ours_mixture(workers: int) -> Any:
    import lancedb

    from loader import MixedDataset, StreamingDataLoader, StreamingDataset

    db = lancedb.connect(str(ROOT / "lancedb"))
    datasets = {
        name: StreamingDataset(
            db.open_table(name), num_splits=16, shuffle_seed=SEED, shuffle_clump_size=CLUMP
        )
        for name in SIZES
    }
    mixture = MixedDataset(datasets, list(SIZES.values()), iterate_over_all=True)
    return StreamingDataLoader(mixture, global_batch_size=BATCH, num_workers=workers)


def litdata_mixture(workers: int) -> Any:
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset

    parts = [
        StreamingDataset(str(ROOT / "litdata" / name), shuffle=True, seed=SEED) for name in SIZES
    ]
    combined = CombinedStreamingDataset(datasets=parts, iterate_over_all=True, seed=SEED)
    return StreamingDataLoader(combined, batch_size=BATCH, num_workers=workers)


def epoch_rate(
    make: Callable[[int], Any], workers: int, epochs: int, warm: int = 0
) -> tuple[float, float, int, float]:
    """Rows/s of `epochs` epochs of a built loader after `warm` untimed ones (its first read
    included, building it not: three tables take three opens, a fixed cost of a run, not of
    its rows): by the wall clock, and by this process's CPU time (all its threads; on a
    shared machine the steadier figure, and the whole cost where there are no workers);
    rows, and minor page faults an epoch."""
    loader = make(workers)
    if warm:
        _timed(loader, warm)
    return _timed(loader, epochs)


def _timed(loader: Any, epochs: int) -> tuple[float, float, int, float]:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu = time.perf_counter(), time.process_time()
    rows = 0
    for _ in range(epochs):
        for batch in loader:
            rows += len(batch["id"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return rows / wall, rows / cpu, rows, faults / epochs


def fresh_rate(name: str, workers: int, epochs: int, warm: int) -> tuple[float, float, int, float]:
    """`epoch_rate` of loader `name` in a process of its own, after `warm` untimed epochs."""
    cmd = [sys.executable, __file__, "--one", name, "--workers", str(workers)]
    cmd += ["--epochs", str(epochs), "--warm", str(warm)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
    wall, cpu, rows, faults = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, cpu, int(rows), faults


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3, help="epochs per measurement")
    p.add_argument("--warm", type=int, default=1, help="untimed epochs before a measurement")
    p.add_argument("--one-process", action="store_true", help="every measurement in this process")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a measurement's own process
    args = p.parse_args()
    try:
        import litdata  # noqa: F401

        has_litdata = True
    except ImportError:
        has_litdata = False
    loaders: dict[str, Callable[[int], Any]] = {"single": ours_single, "mixture": ours_mixture}
    if has_litdata:
        loaders["litdata"] = litdata_mixture
    if args.one:  # warm the loader itself: kernels, page cache, imports, the heap
        print(json.dumps(epoch_rate(loaders[args.one], args.workers, args.epochs, args.warm)))
        return
    build(has_litdata)
    if args.one_process and args.warm:
        for make in loaders.values():  # warm: kernels, page cache, imports
            epoch_rate(make, args.workers, args.warm)
    figures: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "cpu": [], "faults": []} for name in loaders
    }
    rows: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, make in loaders.items():
            if args.one_process:
                wall, cpu, rows[name], faults = epoch_rate(make, args.workers, args.epochs)
            else:
                wall, cpu, rows[name], faults = fresh_rate(
                    name, args.workers, args.epochs, args.warm
                )
            for key, value in (("wall", wall), ("cpu", cpu), ("faults", faults)):
                figures[name][key].append(value)
    where = "one process" if args.one_process else f"a process each, warm epochs: {args.warm}"
    print(
        f"rows per measurement: {rows}; batch {BATCH}; num_workers {args.workers};"
        f" {args.rounds} rounds;"
        f" {where}"
    )
    for label in ("wall", "cpu"):
        median = {name: statistics.median(f[label]) for name, f in figures.items()}
        for name, rate in median.items():
            runs = figures[name][label]
            spread = f"{min(runs):,.0f}-{max(runs):,.0f}"
            print(f"{label:<5}{name:<8} {rate:>12,.0f} rows/s (median; rounds {spread})")
        print(
            f"{label:<5}mixture / single  = {median['mixture'] / median['single']:.2f}  (target >= 0.9)"
        )
        if has_litdata:
            print(
                f"{label:<5}mixture / litdata = {median['mixture'] / median['litdata']:.2f}  (target >= 1)"
            )
    faults = {name: f"{statistics.median(f['faults']):,.0f}" for name, f in figures.items()}
    print(f"minor page faults an epoch (median): {faults}")


if __name__ == "__main__":
    main()
