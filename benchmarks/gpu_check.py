"""Rows/s the loader delivers into GPU memory vs what a small model's step consumes.

Run by ``gpu_check.sh`` as one rank over NCCL (torchrun --standalone). Three figures:

1. ``loader``: StreamingDataLoader with pin_memory, each batch copied with
   ``.to(device, non_blocking=True)``, a synchronize at the end: rows/s into the GPU;
2. ``model``: the step time of a small MLP (DDP, one rank) on a batch already on the GPU;
3. ``train``: both together, the loader feeding the model: rows/s of real training.

If ``train`` is close to ``model`` the GPU is the bottleneck (what we want); if it is close
to ``loader``, the input pipeline is.

4. ``to_device``: input-to-device of packed token batches (seq_len 2048, 8 blocks, four int64
   fields: 512 KiB a batch) from the loader with ``pin_memory=True`` and with pageable memory:
   the host-to-device copy time alone per batch (issued non-blocking, then synchronized) and
   tokens/s into the device, the loader included.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

DIM, CLASSES = 128, 10


def make_table(path: Path, rows: int) -> str:
    import lancedb

    db = lancedb.connect(str(path))
    if "rows" in db.list_tables().tables and db.open_table("rows").count_rows() == rows:
        return str(path)
    x = np.random.default_rng(0).standard_normal((rows, DIM), np.float32)
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM),
            "label": pa.array(np.arange(rows) % CLASSES),
        }
    )
    db.create_table("rows", table, mode="overwrite")
    return str(path)


def loader(db: str, batch: int, workers: int):  # type: ignore[no-untyped-def]
    import lancedb

    from loader import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        lancedb.connect(db).open_table("rows"), num_splits=8, shuffle_clump_size=1024
    )
    return StreamingDataLoader(ds, batch_size=batch, num_workers=workers, pin_memory=True)


def timed_rows(batches, step, device: torch.device, seconds: float) -> float:  # type: ignore[no-untyped-def]
    """Rows/s over `seconds` (after two warm-up batches), with a final synchronize."""
    rows, start = 0, None
    for i, batch in enumerate(batches):
        x = batch["x"].to(device, non_blocking=True)
        y = batch["label"].to(device, non_blocking=True)
        step(x, y)
        if i == 1:
            torch.cuda.synchronize(device)
            start = time.perf_counter()
        elif start is not None:
            rows += len(x)
            if time.perf_counter() - start > seconds:
                break
    torch.cuda.synchronize(device)
    assert start is not None, "the table is too small for two batches"
    return rows / (time.perf_counter() - start)


def packed_loader(data: Path, workers: int, pinned: bool):  # type: ignore[no-untyped-def]
    """Packed blocks of 2048 tokens from a table of 20,000 documents of 64-4,095 tokens."""
    import lancedb

    from loader import StreamingDataLoader, StreamingDataset

    db = lancedb.connect(str(data / "tokens"))
    if "tokens" not in db.list_tables().tables:
        rng = np.random.default_rng(0)
        offsets = np.concatenate([[0], np.cumsum(rng.integers(64, 4096, 20_000))]).astype(np.int32)
        values = pa.array(rng.integers(1, 50_000, int(offsets[-1]), dtype=np.int32))
        column = pa.ListArray.from_arrays(pa.array(offsets), values)
        db.create_table("tokens", pa.table({"tokens": column}))
    ds = StreamingDataset(
        db.open_table("tokens"), columns=["tokens"], num_splits=8, pack_sequences=2048, eos_id=0
    )
    return StreamingDataLoader(ds, batch_size=8, num_workers=workers, pin_memory=pinned)


def to_device(batches, device: torch.device, seconds: float) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Host-to-device copy time per batch (copies issued non-blocking, then synchronized) and
    tokens/s into the device, the loader's time included, after two warm-up batches."""
    copy_s, tokens, count, start = 0.0, 0, 0, None
    for i, batch in enumerate(batches):
        began = time.perf_counter()
        on_device = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        torch.cuda.synchronize(device)
        if i == 1:
            start = time.perf_counter()
        elif start is not None:
            copy_s += time.perf_counter() - began
            tokens += on_device["input_ids"].numel()
            count += 1
            if time.perf_counter() - start > seconds:
                break
    assert start is not None and count, "the token table is too small for three batches"
    return {
        "copy_ms_per_batch": 1000 * copy_s / count,
        "tokens_per_s": tokens / (time.perf_counter() - start),
        "pinned": bool(batch["input_ids"].is_pinned()),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--data", default="benchmarks/data/gpu_check")
    args = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    db = make_table(Path(args.data), args.rows)
    model = DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(DIM, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(), torch.nn.Linear(1024, CLASSES),
        ).to(device),
        device_ids=[local_rank],
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    fixed = next(iter(loader(db, args.batch, 0)))
    on_gpu = {k: v.to(device) for k, v in fixed.items()}
    figures = {
        "loader_rows_per_s": timed_rows(
            loader(db, args.batch, args.workers), lambda x, y: None, device, args.seconds
        ),
        "model_rows_per_s": timed_rows(
            iter(lambda: on_gpu, None), train_step, device, args.seconds
        ),
        "train_rows_per_s": timed_rows(
            loader(db, args.batch, args.workers), train_step, device, args.seconds
        ),
    }
    for pinned in (True, False):
        key = "pinned" if pinned else "pageable"
        figures[f"to_device_{key}"] = to_device(
            packed_loader(Path(args.data), args.workers, pinned), device, args.seconds
        )
    figures["model_step_ms"] = 1000 * args.batch / figures["model_rows_per_s"]
    figures["train_over_model"] = figures["train_rows_per_s"] / figures["model_rows_per_s"]
    figures.update(gpu=torch.cuda.get_device_name(device), batch=args.batch, workers=args.workers)
    print(json.dumps(figures, indent=1), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
