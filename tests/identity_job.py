"""One rank of a torchrun job for tests/test_job_identity.py: telemetry on (the collector in
$ELASTIC_LOADER_TELEMETRY) with the default run id. Reads 2 batches from a fresh start or
from the checkpoint, rank 0 saves the checkpoint; `crash` then dies without closing."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from loader import StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save
from tests.net import wait_until


def main(data: str, checkpoint: str, mode: str) -> None:
    dist.init_process_group("gloo")
    dl = StreamingDataLoader(StreamingDataset(data, num_splits=4, shuffle_seed=3), batch_size=8)
    if mode == "resume":
        dl.load_state_dict(load(checkpoint))
    for step, _ in enumerate(dl):
        if step == 1:
            break
    if dist.get_rank() == 0:
        save(dl.state_dict(), checkpoint)
    client = dl._telemetry.client
    assert client is not None
    wait_until(lambda: client.sent or None, 60, "a first report sent")
    dist.barrier()
    if mode == "crash":
        os._exit(1)  # killed: no `closed`
    dl.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
