"""The job of tests/test_preemption.py, run as `python -m tests.preempt_job JOB_JSON`: two
Gloo ranks with two DataLoader workers each, following the preemption recipe of
docs/large-models.md. Started in a session of its own, so the test can SIGTERM every process
of it at once (launcher, ranks, workers), as SLURM and Kubernetes do.

Fresh start: each rank logs every batch it trained on, and after PAUSE_AT steps waits for
the signal (a long training step), so the SIGTERM surely lands mid-epoch with the workers
prefetching; the ranks then train on to the next step at which they agree to stop, which
needs batches the workers make after the signal. Resume (`"resume": true`): from `checkpoint.latest`, to the end of the epoch.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loader import StreamingDataLoader, StreamingDataset, checkpoint

NUM_ROWS, NUM_SPLITS, GLOBAL_BATCH, PAUSE_AT = 480, 8, 16, 6  # 30 steps an epoch
# The ranks agree whether to stop every CHECK_EVERY steps (one all_reduce): after the
# signal they still train 10 steps, more than the workers had prefetched.
CHECK_EVERY = 16


def rank_main(rank: int, port: int, job: dict[str, Any]) -> None:
    stop = threading.Event()  # the recipe: the handler only raises a flag
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ds = StreamingDataset(job["uri"], columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=4)
    dl = StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH, num_workers=2, read_size=8)
    resume = job.get("resume", False)
    if resume:
        latest = checkpoint.latest(job["ckpt"])
        assert latest is not None, "no checkpoint"
        dl.load_state_dict(checkpoint.load(latest))
    log = Path(job["out"], f"{'resume' if resume else 'first'}-rank{rank}.jsonl")
    with log.open("ab") as out:
        for step, batch in enumerate(dl):
            out.write(orjson.dumps(batch["id"].tolist()) + b"\n")  # "trained"
            out.flush()
            if step + 1 == PAUSE_AT and not resume:
                Path(job["out"], f"paused-{rank}").touch()
                stop.wait()  # a long step; the preemption arrives during it
            if (step + 1) % CHECK_EVERY:
                continue
            flag = torch.tensor([stop.is_set()], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if flag.item():
                if rank == 0:  # the state is the job's: one rank writes it
                    checkpoint.save(dl.state_dict(), job["ckpt"])
                dist.barrier()
                break
    dl.close()
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    job = orjson.loads(Path(argv[0]).read_bytes())
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher waits for its ranks
    mp.spawn(rank_main, args=(job["port"], job), nprocs=2, join=True)


if __name__ == "__main__":
    main(sys.argv[1:])
