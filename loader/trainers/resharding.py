"""Refusing a second sharding of a dataset that is sharded already.

Accelerate (and so Hugging Face's Trainer, which hands it a plain DataLoader over its
`train_dataset`) shards an IterableDataset again: each process keeps 1/W of what the
dataset yields (`IterableDatasetShard`), or process 0 alone reads and deals out its batches
(`DataLoaderDispatcher`). A StreamingDataset yields only its own process's rows, so either
way only 1 row in W is trained on, with no error (issue 34: 1,200 of 2,400 rows an epoch
on 2 processes). Both wrappers call the dataset's `set_epoch` on every process before any
batch (and `IterableDatasetShard` iterates it from its own frame), so the dataset looks at
who called it there and refuses, on every process, before a row is lost or a collective
waits on a process that stopped.
"""

from __future__ import annotations

import sys

WRAPPERS = ("accelerate.data_loader",)  # modules whose callers re-shard what they iterate

SUPPORTED = (
    "with Hugging Face's Trainer use loader.trainers.hf.StreamingTrainer "
    "(train_dataset=dataset, or train_dataloader=StreamingDataLoader(dataset, "
    "global_batch_size=G)); with Accelerate, accelerator.prepare(StreamingDataLoader(...)) "
    "(docs/trainers.md)"
)


def refuse_resharding(rank: int, world_size: int, depth: int = 2) -> None:
    """Raise when the caller `depth` frames up (the one that called the dataset's method) is
    a wrapper that shards again, and the dataset is one process's share of several."""
    if world_size < 2:
        return  # one process reads every row: a wrapper over it shards them correctly
    caller = sys._getframe(depth).f_globals.get("__name__")
    if caller not in WRAPPERS:
        return
    raise ValueError(
        f"this StreamingDataset is process {rank}'s share of {world_size} already; a plain "
        f"DataLoader over it, prepared by Accelerate (Hugging Face "
        f"Trainer(train_dataset=...), accelerator.prepare(DataLoader(dataset))), would shard "
        f"it again and train on 1 row in {world_size}. Instead: {SUPPORTED}"
    )
