"""A crash under `torch.multiprocessing` for the browser test:
`python -m tests.mp_crash_job API RUN DIR`.

Three spawned ranks (`rank=`/`world_size=` loaders over a table in memory, telemetry to API)
each read `STEPS` batches and write `DIR/ready-R`; once all three are ready, rank 1 SIGKILLs
itself. `torch.multiprocessing`'s join then SIGTERMs ranks 0 and 2 milliseconds later and
raises, as a real job's launcher does: the page must name rank 1, not the survivors.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pyarrow as pa
import torch.multiprocessing as mp

from loader import StreamingDataLoader, StreamingDataset
from tests.net import wait_until

WORLD, STEPS = 3, 5


def rank_main(rank: int, api: str, run: str, folder: str) -> None:
    table = pa.table({"id": list(range(600))})
    ds = StreamingDataset(table, num_splits=6, shuffle_seed=1, rank=rank, world_size=WORLD)
    dl = StreamingDataLoader(ds, global_batch_size=12, telemetry=api, run_id=run)
    it = iter(dl)
    for _ in range(STEPS):
        next(it)
    client = dl._telemetry.client  # type: ignore[attr-defined]
    for _ in range(2):  # two sends after its last step: one built after it, step 5, is in
        sent = client.sent
        wait_until(lambda sent=sent: client.sent != sent, 120, "a report sent after step 5")
    Path(folder, f"ready-{rank}").touch()
    if rank == 1:
        ready = [Path(folder, f"ready-{r}") for r in range(WORLD)]
        wait_until(lambda: all(p.exists() for p in ready), 120, "every rank ready")
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait()  # "training" until the launcher terminates it


def main(api: str, run: str, folder: str) -> None:
    mp.start_processes(rank_main, args=(api, run, folder), nprocs=WORLD, start_method="spawn")


if __name__ == "__main__":
    main(*sys.argv[1:4])
