"""Rank body for tests/test_mixture_dist.py (module level, so spawned processes import it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lancedb
import orjson
import torch.distributed as dist

from loader import MixedDataset, StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save

GLOBAL_BATCH = 12


def mixture(
    db: str, folder: str, rank: int | None = None, world: int | None = None
) -> MixedDataset:
    """A LanceDB table (S=4) and Parquet files (S=3) at 3:1."""
    table = lancedb.connect(db).open_table("rows")
    kw: dict[str, Any] = {"columns": ["id"], "rank": rank, "world_size": world}
    web = StreamingDataset(table, num_splits=4, shuffle_seed=3, **kw)
    code = StreamingDataset(folder, num_splits=3, shuffle_seed=4, **kw)
    return MixedDataset({"web": web, "code": code}, [3, 1])


def run_rank(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    """Read `steps` batches with workers, save a checkpoint file on rank 0, record them."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mix = mixture(job["db"], job["folder"])
        dl = StreamingDataLoader(mix, global_batch_size=GLOBAL_BATCH, num_workers=2)
        if job.get("resume"):
            dl.load_state_dict(load(job["resume"]))
        batches = []
        for batch in dl:
            batches.append(list(zip(batch["source"].tolist(), batch["id"].tolist(), strict=True)))
            if len(batches) == job["steps"]:
                break
        if rank == 0:
            save(dl.state_dict(), job["save"])
        Path(job["out"], f"rank{rank}.json").write_bytes(orjson.dumps({"batches": batches}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
