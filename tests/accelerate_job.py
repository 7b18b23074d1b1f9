"""The processes of tests/test_accelerate.py: Accelerate on Gloo, the documented recipe."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import torch
from accelerate import Accelerator, DataLoaderConfiguration

from loader import StreamingDataLoader, StreamingDataset

NUM_ROWS, NUM_SPLITS, GLOBAL_BATCH, SAVED_AT = 240, 6, 12, 5  # 20 steps an epoch


def run(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    """Train: Accelerate prepares the model, optimizer and our loader (handed back as it
    is), `register_for_checkpointing(dl)`; save after SAVED_AT steps, or load and finish."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    resume = world != 2
    config = DataLoaderConfiguration(dispatch_batches=True if resume else None)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    ds = StreamingDataset(job["uri"], columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=3)
    dl = StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH)
    model = torch.nn.Linear(1, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, dl)
    accelerator.register_for_checkpointing(dl)
    if resume:
        accelerator.load_state(job["state"])
    batches = []
    for batch in dl:
        loss = model(batch["id"].to(torch.float64)[:, None]).sum()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        batches.append(batch["id"].tolist())
        if len(batches) == SAVED_AT and not resume:
            break
    if not resume:
        accelerator.save_state(job["state"])
    accelerator.wait_for_everyone()
    record = {"untouched": prepared is dl, "batches": batches, "world": ds.world_size}
    Path(job["out"], f"w{world}-rank{rank}.json").write_bytes(orjson.dumps(record))
    accelerator.end_training()
