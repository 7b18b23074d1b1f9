"""The training script of tests/test_elastic_nodes.py, run by `torchrun --nnodes=1:3`.

Every incarnation (a torchrun restart on the nodes that answer) resumes from
`checkpoint.latest` and logs the rows of each step it completed to a file named by its world
size and the step it resumed from. It checkpoints every EVERY steps and, after the steps
`HOLD_AT` names, waits for a file the test writes, so that a node is killed or added
between two known steps, never during a save.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import orjson
import torch
import torch.distributed as dist

from loader import StreamingDataLoader, StreamingDataset, checkpoint

NUM_ROWS, NUM_SPLITS, GLOBAL_BATCH, EVERY = 360, 6, 12, 6  # 30 steps an epoch
HOLD_AT = (6, 12)  # after these steps: wait for go-<step> (killed at 6, joined at 12)
HOLD_S = 600.0


def main(folder: str) -> None:
    out = Path(folder)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = StreamingDataset(
        str(out / "rows.lance"), columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=2
    )
    dl = StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH)
    folder_uri = f"{out}/ckpt/"  # a folder: the trailing slash (a Path would drop it)
    latest = checkpoint.latest(folder_uri)
    if latest is not None:
        dl.load_state_dict(checkpoint.load(latest))
    first = dl.global_step
    log = out / f"inc-from{first:03d}-w{world}-rank{rank}.jsonl"
    with log.open("ab") as rows:
        for batch in dl:
            done = torch.tensor([1], dtype=torch.int64)
            dist.all_reduce(done)  # the step's collective: a lost peer fails it here
            step = dl.global_step
            rows.write(orjson.dumps({"step": step, "ids": batch["id"].tolist()}) + b"\n")
            rows.flush()
            if step % EVERY == 0:
                if rank == 0:
                    checkpoint.save(dl.state_dict(), folder_uri)
                dist.barrier()
            if step in HOLD_AT:
                (out / f"held-{step}-w{world}-rank{rank}").touch()
                deadline = time.monotonic() + HOLD_S
                while not (out / f"go-{step}").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
    dl.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main(sys.argv[1])
