"""A healthy 2-rank job for the no-flap test: `python -m tests.no_flap_job API RUN DIR`.

Two ranks spawned by `torch.multiprocessing`, joined in a Gloo process group, read a table
in memory through real `StreamingDataLoader`s reporting to API as RUN: one batch a step,
an all-reduce a step (the ranks stay in lock-step as DDP keeps them), about 50 steps a
second, and every `SAVE_EVERY` steps each rank saves a checkpoint through
`loader.checkpoint.save` (its event is sent at once: a short send interval). Each rank
writes `DIR/ready-R` once its first report is in. When `DIR/stop` appears, rank 0 tells
the other through the step's all-reduce; both read the rest of the epoch without pausing
(the job ends at an epoch's end: it finished), close their loaders and exit 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loader import StreamingDataLoader, StreamingDataset, checkpoint

WORLD, ROWS, G, PACE_S, SAVE_EVERY = 2, 20_000, 16, 0.02, 50


def rank_main(rank: int, api: str, run: str, folder: str) -> None:
    where = Path(folder)
    dist.init_process_group(
        "gloo", init_method=f"file://{where / 'rendezvous'}", rank=rank, world_size=WORLD
    )
    table = pa.table({"id": list(range(ROWS))})
    dl = StreamingDataLoader(
        StreamingDataset(table, num_splits=4, shuffle_seed=1),
        global_batch_size=G,
        telemetry=api,
        run_id=run,
    )
    step, stopping, ready = 0, False, False
    while not stopping:
        for _ in dl:  # one epoch
            flag = torch.tensor([float(rank == 0 and (where / "stop").exists())])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the step's gradient all-reduce
            stopping = stopping or bool(flag.item())
            step += 1
            if step % SAVE_EVERY == 0:
                checkpoint.save(dl.state_dict(), where / f"ckpt-{rank}-{step % 3}.json")
            if not ready and dl._telemetry.client.sent > 0:  # type: ignore[attr-defined]
                (where / f"ready-{rank}").touch()  # its first report is in: it is on the page
                ready = True
            if not stopping:
                time.sleep(PACE_S)  # the rest of a training step
    dl.close()
    dist.destroy_process_group()


def main(api: str, run: str, folder: str) -> None:
    mp.start_processes(rank_main, args=(api, run, folder), nprocs=WORLD, start_method="spawn")


if __name__ == "__main__":
    main(*sys.argv[1:4])
