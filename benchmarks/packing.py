"""Issue #13's packed-token figures, in one process, on one synthetic LanceDB table.

Runs in the project's own venv (lancedb.streaming ships with lancedb; LitData is not used):

    PYTHONPATH=. benchmarks/.venv/bin/python benchmarks/packing.py [--docs 20000] [--reps 3]

(the project's .venv runs it too, without the LitData row; `--scan-only --s3-docs 0` runs
only ours, ours narrow, the raw scan, the raw take and ours' reads without the loader's
loop: the ÷ scan A/B of issue #35 item 8 and where its time goes.)

- `tokens/s ours ÷ lancedb.streaming`: both pack the same `list<int32>` column into blocks
  of 2048 (S = 4, rank 0 of 1, no workers, batches of 8 blocks), each drained for at most
  `--seconds`; lancedb.streaming needs `blocks_per_epoch` (we pass ours' count).
- `ours ÷ raw Lance read`: tokens/s of ours against reading the token column of the same
  table front to back with `to_batches` into one flat NumPy array per batch (no shuffle,
  no packing): the floor of what any packing reader pays.
- `ours, narrow`: the same blocks with `pack_fields=["input_ids", "cu_seqlens"]` and
  `pack_dtype="int32"` (4 bytes a token, as LitData's `TokensLoader` hands out; the other
  fields derivable on the GPU with `loader.derive_packed_fields`), against the same peers.
- `resume at 90 %`: time from building the dataset and loader (lengths pass included) to
  the first batch, after `load_state_dict` of a state at 90 % of the epoch, over the same
  for a fresh start; medians of 5, alternating.
- `varlen ÷ fixed`: values/s of a `list<int32>` column (lengths 1..255, mean 128) against a
  `fixed_size_list<int32>[128]` column of the same row count (batches of 256 rows).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa

from loader import StreamingDataLoader, StreamingDataset
from loader.packing import PACKED_CLUMP
from loader.progress import Batching
from loader.read.packed_reader import PackedReader, block_documents
from loader.stream import task_order_indices

SEQ_LEN, SPLITS, BATCH, EOS = 2048, 4, 8, 0
NARROW = {"pack_fields": ["input_ids", "cu_seqlens"], "pack_dtype": "int32"}
CLUMPS = (1, 16, 64, 256, 1024)  # the trade-off sweep of shuffle_clump_size, in documents


@functools.cache
def token_arrays(docs: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of `docs` documents of 64..4095 random token ids (seeded)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(64, 4096, docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return offsets, rng.integers(1, 50_000, int(offsets[-1]), dtype=np.int32)


def token_table(db: Any, docs: int) -> Any:
    offsets, values = token_arrays(docs)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    return db.create_table("tokens", pa.table({"tokens": tokens}), mode="overwrite")


def _litdata_document(item: tuple[int, int]) -> Any:
    """One document and its eos, as LitGPT's prepare scripts write them (module level:
    litdata's optimize workers import it)."""
    import torch

    offsets, values = token_arrays(item[0])
    yield torch.from_numpy(np.append(values[offsets[item[1]] : offsets[item[1] + 1]], EOS))


def litdata_tokens(out: Path, docs: int, seconds: float) -> float | None:
    """LitData's TokensLoader on the same documents (optimize'd to `out`), shuffled, or
    None where litdata is not installed (the project venv; see setup_env.sh)."""
    try:
        from litdata import TokensLoader, optimize
    except ImportError:
        return None
    items = [(docs, i) for i in range(docs)]
    optimize(
        fn=_litdata_document, inputs=items, output_dir=str(out), chunk_size=(SEQ_LEN + 1) * 1024,
        item_loader=TokensLoader(), num_workers=1,
    )  # fmt: skip
    return litdata_read(out, seconds)


def litdata_read(out: Path, seconds: float) -> float:
    """LitData's TokensLoader over the optimize'd documents, shuffled (its chunks of
    2049 * 1024 tokens shuffled, and the blocks inside each)."""
    from litdata import StreamingDataLoader as LitLoader
    from litdata import StreamingDataset as LitDataset
    from litdata import TokensLoader

    ds = LitDataset(str(out), item_loader=TokensLoader(block_size=SEQ_LEN), shuffle=True)
    return drain(LitLoader(ds, batch_size=BATCH), lambda b: b.numel(), seconds)


CPU_PER_UNIT: list[float] = []  # each drain's process CPU seconds (all threads) per unit


def drain(batches: Iterable[Any], count: Callable[[Any], int], seconds: float) -> float:
    """Units per second from starting the iteration (the first read included: with
    read_size 8192 it holds 8192 blocks) to the last batch within `seconds`; the CPU
    seconds per unit go to CPU_PER_UNIT (steadier than wall time on a loaded machine)."""
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    for batch in batches:
        done += count(batch)
        if time.perf_counter() - start > seconds:
            break
    CPU_PER_UNIT.append((time.process_time() - cpu) / max(done, 1))
    return done / (time.perf_counter() - start)


def ours(table: Any, **kw: Any) -> StreamingDataLoader:
    ds = StreamingDataset(
        table, columns=["tokens"], num_splits=SPLITS, rank=0, world_size=1,
        pack_sequences=SEQ_LEN, eos_id=EOS, **kw,
    )  # fmt: skip
    return StreamingDataLoader(ds, batch_size=BATCH)


def theirs(table: Any, blocks: int) -> Any:
    from lancedb.streaming import StreamingDataLoader as TheirLoader
    from lancedb.streaming import StreamingDataset as TheirDataset

    ds = TheirDataset(
        table, num_splits=SPLITS, columns=["tokens"], pack_sequences=SEQ_LEN, eos_id=EOS,
        pad_id=EOS, blocks_per_epoch=blocks,
    )  # fmt: skip
    return TheirLoader(ds, batch_size=BATCH)


def raw_take(loader: StreamingDataLoader) -> Iterable[int]:
    """Lance `take` of exactly the documents each of ours' reads covers (sorted, one call a
    read), values to NumPy: ours' own reads with the packing left out. Yields tokens."""
    reader = loader.streaming_dataset.reader
    assert isinstance(reader, PackedReader)
    stream = loader.progress.peek(Batching(BATCH, False))
    layout = reader.packing.epoch(stream.epoch)
    per_split = layout.blocks_per_split
    for task in stream.tasks(loader.batches_per_read):
        splits, levels = np.divmod(task_order_indices(task, per_split), per_split)
        documents = np.unique(block_documents(layout, splits, levels)[0])
        positions = np.sort(reader.plan.epoch(task.epoch).order(documents))
        column = reader._rows().take(positions).column("tokens").combine_chunks()
        yield len(column.values.to_numpy())


def reads_only(loader: StreamingDataLoader) -> Iterable[int]:
    """Ours' reads (take, packing kernel, cu_seqlens) and each batch cut from them, one read
    at a time in this thread, without the loader's per-batch loop: the loader's row less
    this one is what its loop costs. Yields tokens."""
    reader = loader.streaming_dataset.reader
    stream = loader.progress.peek(Batching(BATCH, False))
    for task in stream.tasks(loader.batches_per_read):
        yield sum(_tokens(batch) for batch in reader.batches(task))


def raw_read(table: Any) -> Iterable[np.ndarray]:
    for batch in table.to_lance().to_batches(columns=["tokens"], batch_size=64):
        yield batch.column(0).values.to_numpy()


def scan_pairs(table: Any, pairs: int, reads_in_flight: int | None) -> list[list[float]]:
    """Whole epochs of ours (default batch) and of the raw scan, alternating: per pair, ours
    ÷ scan in tokens/s, and the CPU ns a token of each (issue #35 item 8's A/B: run it in
    alternating processes with each side's `loader` first on the path)."""
    out = []
    for _ in range(pairs):
        loader = ours(table)
        if reads_in_flight is not None and reads_in_flight >= 0:  # -1/None: the default
            loader.reads_in_flight = reads_in_flight
        rate = drain(loader, _tokens, float("inf"))
        scan = drain(raw_read(table), len, float("inf"))
        out.append([rate / scan, CPU_PER_UNIT[-2] * 1e9, CPU_PER_UNIT[-1] * 1e9])
    return out


def first_batch_seconds(table: Any, state: dict[str, Any] | None) -> float:
    start = time.perf_counter()
    loader = ours(table)
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def resume_ratio(table: Any) -> float:
    loader = ours(table)
    stop = int(0.9 * len(loader))
    for step, _ in enumerate(loader):
        if step + 1 == stop:
            break
    state = loader.state_dict()
    fresh, resumed = [], []
    for _ in range(5):
        fresh.append(first_batch_seconds(table, None))
        resumed.append(first_batch_seconds(table, state))
    return statistics.median(resumed) / statistics.median(fresh)


def varlen_ratio(db: Any, rows: int, seconds: float) -> float:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 256, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    varlen = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(np.arange(offsets[-1], dtype=np.int32))
    )
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(rows * 128, dtype=np.int32)), 128)
    rates = {}
    for name, column in (("varlen", varlen), ("fixed", fixed)):
        table = db.create_table(name, pa.table({"v": column}), mode="overwrite")
        loaders = [
            StreamingDataLoader(
                StreamingDataset(table, num_splits=SPLITS, rank=0, world_size=1), batch_size=256
            )
            for _ in range(2)
        ]
        next(iter(loaders[0]))  # warm: a kernel's first use loads it (or compiles it: ~1 s)
        loader = loaders[1]
        size = (lambda b: len(b["v"].values)) if name == "varlen" else (lambda b: b["v"].numel())
        rates[name] = drain(loader, size, seconds)
    return rates["varlen"] / rates["fixed"]


def clump_sweep(table: Any, seconds: float, reps: int) -> dict[int, list[float]]:
    """Tokens/s of ours at each shuffle_clump_size (documents), S = 4: the trade-off."""
    rates: dict[int, list[float]] = {}
    for _ in range(reps):
        for clump in CLUMPS:
            loader = ours(table, shuffle_clump_size=clump)
            rates.setdefault(clump, []).append(drain(loader, _tokens, seconds))
    return rates


def s3_units(docs: int, reps: int) -> dict[tuple[int, str], list[float]]:
    """Tokens/s on a loopback S3 server (moto), C = 256: whole-unit reads (the default
    there) against one sorted take of exactly the documents per read, S = 4 and 48."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.object_store
    from tests.object_store import running_s3_server

    rates: dict[tuple[int, str], list[float]] = {}
    with running_s3_server() as server:
        db = lancedb.connect(
            f"s3://{server.make_bucket()}/db", storage_options=server.storage_options
        )
        table = token_table(db, docs)
        for _ in range(reps):
            for splits in (4, 48):
                for mode in ("units", "exact"):
                    ds = StreamingDataset(
                        table, columns=["tokens"], num_splits=splits, rank=0, world_size=1,
                        pack_sequences=SEQ_LEN, eos_id=EOS, shuffle_clump_size=256,
                    )  # fmt: skip
                    assert isinstance(ds.reader, PackedReader) and ds.reader.unit_reads
                    ds.reader.unit_reads = mode == "units"
                    loader = StreamingDataLoader(ds, batch_size=BATCH)
                    start, tokens = time.perf_counter(), 0
                    for batch in loader:  # the whole epoch, its first read included
                        tokens += _tokens(batch)
                    rates.setdefault((splits, mode), []).append(
                        tokens / (time.perf_counter() - start)
                    )
    return rates


def _tokens(batch: Any) -> int:
    return int(batch["input_ids"].numel())


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--docs", type=int, default=20_000)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--s3-docs", type=int, default=4000, help="0: leave the S3 rows out")
    p.add_argument(
        "--scan-only", action="store_true",
        help="only ours (default and narrow), the raw scan and the raw take: ÷ scan A/B runs",
    )  # fmt: skip
    p.add_argument(
        "--pairs", type=int, default=0,
        help="only N (ours, scan) pairs of whole epochs, as JSON (with --reads-in-flight)",
    )  # fmt: skip
    p.add_argument(
        "--reads-in-flight", type=int, default=None, help="with --pairs; -1: the default"
    )
    args = p.parse_args()
    if args.pairs:
        with tempfile.TemporaryDirectory() as tmp:
            table = token_table(lancedb.connect(str(Path(tmp) / "db")), args.docs)
            next(iter(ours(table)))  # warm the kernels
            runs = scan_pairs(table, args.pairs, args.reads_in_flight)
            print(json.dumps({"reads_in_flight": args.reads_in_flight, "runs": runs}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = lancedb.connect(str(Path(tmp) / "db"))
        table = token_table(db, args.docs)
        loader = ours(table)
        blocks = len(loader) * BATCH
        print(f"table: {args.docs} documents, {blocks} blocks of {SEQ_LEN} kept (S={SPLITS})")
        next(iter(ours(table)))  # warm: Numba's cached kernels load (~1 s) on first use
        next(iter(ours(table, **NARROW)))  # and the int32 kernel's
        readers: list[tuple[str, Callable[[], float]]] = [
            (f"ours (default clump {PACKED_CLUMP})", lambda: drain(ours(table), _tokens, args.seconds)),
            ("ours, narrow (input_ids + cu_seqlens, int32)",
             lambda: drain(ours(table, **NARROW), _tokens, args.seconds)),
            ("ours, shuffle_clump_size=1 (the old default)",
             lambda: drain(ours(table, shuffle_clump_size=1), _tokens, args.seconds)),
            ("lancedb.streaming pack_sequences", lambda: drain(theirs(table, blocks), _tokens, args.seconds)),
            ("raw Lance scan of the column", lambda: drain(raw_read(table), len, args.seconds)),
            ("raw take of ours' documents", lambda: drain(raw_take(ours(table)), int, args.seconds)),
            ("ours' reads, no loader loop", lambda: drain(reads_only(ours(table)), int, args.seconds)),
        ]  # fmt: skip
        if args.scan_only:
            readers = [r for r in readers if not r[0].startswith(("lancedb", "ours, shuffle"))]
        lit_dir = Path(tmp) / "litdata"
        # optimize once, then time
        if not args.scan_only and litdata_tokens(lit_dir, args.docs, 0.1) is not None:
            readers.append(
                ("LitData TokensLoader (shuffle)", lambda: litdata_read(lit_dir, args.seconds))
            )
        rates: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        for rep in range(args.reps):
            for name, run in readers:
                rates.setdefault(name, []).append(run())
                cpus.setdefault(name, []).append(CPU_PER_UNIT[-1] * 1e9)
                print(
                    f"  rep {rep + 1} {name:44s} {rates[name][-1]:14,.0f} tokens/s "
                    f"{cpus[name][-1]:6.2f} CPU ns/token",
                    flush=True,
                )
        ours_rates, narrow_rates = rates[readers[0][0]], rates[readers[1][0]]
        print(f"\nmedians of {args.reps} (range); ratios within a repetition")
        for name, values in rates.items():
            line = f"{name:44s} {statistics.median(values):14,.0f} tokens/s"
            if name != readers[0][0]:
                ratio = [a / b for a, b in zip(ours_rates, values, strict=True)]
                line += f"   ours / it = {spread(ratio)}"
            if name not in (readers[0][0], readers[1][0]):
                ratio = [a / b for a, b in zip(narrow_rates, values, strict=True)]
                line += f"   narrow / it = {spread(ratio)}"
            print(line)
        print("\nCPU ns a token (process time, all threads; medians; > 1: ours costs less)")
        mine = [("ours", readers[0][0]), ("narrow", readers[1][0])]
        key0, key1 = readers[0][0], readers[1][0]
        for name, values in cpus.items():
            line = f"{name:44s} {statistics.median(values):8.2f}"
            for label, key in mine[: 0 if name == key0 else 1 if name == key1 else 2]:
                ratio = [b / a for a, b in zip(cpus[key], values, strict=True)]
                line += f"   it / {label} = {spread(ratio)}"
            print(line)
        if args.scan_only:
            return
        print(f"resume at 90 %: first batch / fresh = {resume_ratio(table):.2f}")
        varlen = varlen_ratio(db, 40_000, args.seconds)
        print(f"list<int32> / fixed_size_list<int32>[128] values/s = {varlen:.2f}")
        print("\nshuffle_clump_size (documents) vs tokens/s, S=4, local (medians)")
        for clump, values in clump_sweep(table, args.seconds, args.reps).items():
            print(f"  C={clump:5d} {statistics.median(values):14,.0f} tokens/s")
    if args.s3_docs:
        print(f"\nloopback S3 (moto), {args.s3_docs} documents, C=256, whole epoch (medians)")
        for (splits, mode), values in sorted(s3_units(args.s3_docs, args.reps).items()):
            print(f"  S={splits:2d} {mode:5s} {statistics.median(values):14,.0f} tokens/s")


if __name__ == "__main__":
    main()
