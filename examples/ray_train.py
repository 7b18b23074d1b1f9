"""Ray Train as the launcher: a killed worker, then an elastic ScalingConfig, every row once.

Ray Train starts the workers (TorchTrainer sets up their Gloo or NCCL group) and restarts
them from the last checkpoint a worker *reported* when one dies. The loader needs five
lines to follow it: rank and world size from Ray's context, its state inside the checkpoint
passed to `ray.train.report`, and that state loaded from `ray.train.get_checkpoint()` on
whatever number of workers Ray starts. Do not pass the loader to
`ray.train.torch.prepare_data_loader`: it already reads only this worker's rows, and Ray's
wrapper would hide its `state_dict()` (move batches to `ray.train.torch.get_device()`
yourself).

This example runs one job twice under one name: first on 2 workers, one of which SIGKILLs
itself mid-epoch (Ray restarts both from the last reported checkpoint), stopping at
`--stop-at`; then with `ScalingConfig(num_workers=(2, 3))`, which Ray grows to 3 workers,
resuming from the first run's last checkpoint to the end of the last epoch. Each worker
writes the rows it trained on per step; `check` proves every row once::

    python examples/ray_train.py --work-dir /tmp/ray-demo

Ray is not a dependency of elastic-loader: `pip install 'ray[train]' -c <(echo torch==2.13.0)`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import ray
import ray.train
import ray.train.torch
import torch

from loader import StreamingDataLoader, StreamingDataset, checkpoint

ROWS, NUM_SPLITS, GLOBAL_BATCH, EPOCHS = 480, 6, 24, 2  # 20 steps an epoch, any W dividing 24
LOADER_FILE = "loader.json"


def train_loop(config: dict[str, Any]) -> None:
    """One Ray worker: build, restore, train, report a checkpoint every `every` steps."""
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    ds = StreamingDataset(
        config["uri"], columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=3,
        rank=rank, world_size=world,
    )  # fmt: skip
    dl = StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH, run_id=ctx.get_experiment_name())
    model = ray.train.torch.prepare_model(torch.nn.Linear(1, 1))  # DDP over Ray's group
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    found = ray.train.get_checkpoint()
    if found is not None:
        with found.as_directory() as folder:
            dl.load_state_dict(checkpoint.load(Path(folder, LOADER_FILE)))
            blob = torch.load(Path(folder, "model.pt"))
            model.load_state_dict(blob["model"])
            optimizer.load_state_dict(blob["optimizer"])
    log = Path(config["out"], f"{attempt()}-w{world}-rank{rank}.jsonl")
    device = ray.train.torch.get_device()
    for _ in range(dl.state_dict()["epoch"], EPOCHS):
        for batch in dl:
            ids = batch["id"].to(device)
            loss = model(ids.to(torch.float32)[:, None] / ROWS).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with log.open("a") as out:
                out.write(json.dumps({"step": dl.global_step - 1, "ids": ids.tolist()}) + "\n")
            if dl.global_step % config["every"] == 0 or dl.global_step == config["stop_at"]:
                report(dl, model, optimizer, rank)
            if dl.global_step == config["kill_at"] and rank == world - 1:
                marker = Path(config["out"], "killed")
                if not marker.exists():  # once: the restarted worker goes on
                    marker.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
            if dl.global_step == config["stop_at"]:
                return


def attempt() -> int:
    """One name for this attempt on every worker (rank 0's clock): a restart is a new one."""
    name = [time.time_ns()]
    torch.distributed.broadcast_object_list(name, src=0)
    return int(name[0])


def report(dl: StreamingDataLoader, model: Any, optimizer: Any, rank: int) -> None:
    """Every worker reports; rank 0 attaches the checkpoint (the loader's state is the same
    on every worker)."""
    with tempfile.TemporaryDirectory() as folder:
        if rank == 0:
            checkpoint.save(dl.state_dict(), Path(folder, LOADER_FILE))
            blob = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(blob, Path(folder, "model.pt"))
        found = ray.train.Checkpoint.from_directory(folder) if rank == 0 else None
        ray.train.report({"global_step": dl.global_step}, checkpoint=found)


def fit(work_dir: Path, workers: int | tuple[int, int], **config: Any) -> Any:
    trainer = ray.train.torch.TorchTrainer(
        train_loop,
        train_loop_config={"uri": str(work_dir / "rows.lance"), "out": str(work_dir), **config},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=False),
        run_config=ray.train.RunConfig(
            name="elastic-loader-demo",  # the same name: the second run resumes the first
            storage_path=str(work_dir / "ray"),
            failure_config=ray.train.FailureConfig(max_failures=2),
        ),
    )
    return trainer.fit()


def check(work_dir: Path) -> dict[str, Any]:
    """The rows of each step from the latest attempt that trained it (the steps a restart
    redid replace those of the attempt that died), and whether each epoch has every row once."""
    steps: dict[int, list[int]] = {}
    worlds: dict[int, int] = {}
    attempts = sorted({int(p.name.split("-")[0]) for p in work_dir.glob("*-w*-rank*.jsonl")})
    for name in attempts:  # in the order they started
        batches: dict[int, list[int]] = {}
        for path in work_dir.glob(f"{name}-w*-rank*.jsonl"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                batches.setdefault(record["step"], []).extend(record["ids"])
                worlds[record["step"]] = int(path.name.split("-")[1][1:])
        steps.update(batches)
    per_epoch = ROWS // GLOBAL_BATCH
    epochs = [
        sorted(i for t in range(e * per_epoch, (e + 1) * per_epoch) for i in steps.get(t, []))
        for e in range(EPOCHS)
    ]
    return {
        "steps": len(steps),
        "worlds": sorted(set(worlds.values())),
        "every_row_once": all(rows == list(range(ROWS)) for rows in epochs),
        "batches": [sorted(steps[t]) for t in sorted(steps)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("checkpoints/ray-demo"))
    parser.add_argument("--every", type=int, default=4, help="report a checkpoint every k steps")
    parser.add_argument("--kill-at", type=int, default=10, help="a worker SIGKILLs itself")
    parser.add_argument("--stop-at", type=int, default=30, help="the first run ends here")
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    ids = np.arange(ROWS, dtype=np.int64)
    lance.write_dataset(pa.table({"id": ids}), str(args.work_dir / "rows.lance"), mode="overwrite")
    ray.init(num_cpus=3, include_dashboard=False)
    config = {"every": args.every, "kill_at": args.kill_at, "stop_at": args.stop_at}
    fit(args.work_dir, 2, **config)
    fit(args.work_dir, (2, 3), **{**config, "kill_at": -1, "stop_at": -1})
    ray.shutdown()
    summary = check(args.work_dir)
    print(json.dumps({k: v for k, v in summary.items() if k != "batches"}))
    return 0 if summary["every_row_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
