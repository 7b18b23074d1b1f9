"""Rank bodies for tests/test_distributed.py (module level, so spawned processes import them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lancedb
import orjson
import torch.distributed as dist

from loader import StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save
from tests.tables import make_rows

NUM_SPLITS, GLOBAL_BATCH = 8, 32


def run_rank(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    """Read `steps` batches (all if None) from a resume file or a fresh start; record them."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        table = lancedb.connect(job["db"]).open_table("rows")
        if job.get("race_append"):
            table = _append_while_starting(rank, job["db"], table)
        cache = {k: job[k] for k in ("cache_dir", "cache_limit") if k in job}
        ds = StreamingDataset(
            table, num_splits=NUM_SPLITS, shuffle_clump_size=3, shuffle_seed=7, **cache
        )
        dl = StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH)
        if job.get("resume"):
            dl.load_state_dict(load(job["resume"]))
        batches = []
        for step, batch in enumerate(dl):
            batches.append(batch["id"].tolist())
            if step + 1 == job.get("steps"):
                break
        state = dl.state_dict()
        if rank == 0:
            save(state, job["save"])
        record = {"batches": batches, "state": state, "rows": ds.num_rows}
        Path(job["out"], f"rank{rank}.json").write_bytes(orjson.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _append_while_starting(rank: int, db: str, table: Any) -> Any:
    """Rank 0 keeps its handle on version v; rank 1 appends rows and reopens (sees v+1)."""
    dist.barrier()
    if rank == 1:
        lancedb.connect(db).open_table("rows").add(make_rows(10_000, 10_040))
    dist.barrier()
    if rank == 0:
        return table
    fresh = lancedb.connect(db).open_table("rows")
    assert fresh.count_rows() == 640, "this rank does see the write"
    return fresh


def picked_seed() -> dict[str, Any]:
    """Build a dataset of an Arrow table (no version to agree on) with shuffle_seed=None:
    the seed this rank uses and its first batch."""
    ds = StreamingDataset(make_rows(0, 64), num_splits=4, shuffle_seed=None)
    first = next(iter(StreamingDataLoader(ds, batch_size=8)))["id"].tolist()
    return {"seed": ds.shuffle_seed, "first": first}


def build_on_one_rank(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    """Rank 0 alone builds an eval dataset (rank=0, world_size=1), then both ranks build one
    dataset while rank 1 sees a newer version, and one of an Arrow table with a picked seed
    (`picked_seed`); then rank 0 alone builds a dataset of the whole group (a mistake): a
    clear error after the agreement timeout, never a hang."""
    from tests.net import wait_until

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        table = lancedb.connect(job["db"]).open_table("rows")
        record: dict[str, Any] = {}
        if rank == 0:
            alone = StreamingDataset(table, num_splits=2, rank=0, world_size=1, shuffle_seed=None)
            record["alone"] = [alone.num_rows, len(StreamingDataLoader(alone, batch_size=100))]
        table = _append_while_starting(rank, job["db"], table)
        ds = StreamingDataset(table, num_splits=NUM_SPLITS, shuffle_seed=None)
        record.update(rows=ds.num_rows, version=ds.source.spec.version, seed=ds.shuffle_seed)
        record["picked"] = picked_seed()  # one job for both tests: a spawn costs 10-25 s
        done = Path(job["out"], "rank0-done")
        if rank == 0:
            os.environ["ELASTIC_LOADER_AGREE_TIMEOUT_S"] = "3"
            try:
                StreamingDataset(table, num_splits=NUM_SPLITS)
            except TimeoutError as err:
                record["timeout"] = str(err)
            done.touch()
        else:
            wait_until(done.exists, 120, "rank 0's dataset built alone")
        Path(job["out"], f"rank{rank}.json").write_bytes(orjson.dumps(record))
    finally:
        dist.destroy_process_group()
