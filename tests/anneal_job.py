"""Rank body for tests/test_mixture_anneal.py (module level, so spawned processes import it):
a mixture of three Parquet tables annealed 6:3:1 -> 2:5:3 at global step SWITCH, once by
`schedule=` and once by `set_weights`, training a one-parameter model whose loss is
all-reduced each step. Each job saves (loader state, parameter) at its `save_at` step, runs
two steps more and is killed (SIGKILL, as a lost node); the resumed job loads and goes on."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import orjson
import torch
import torch.distributed as dist

from loader import MixedDataset, StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save

G = 12
SWITCH = 12  # the global step from which 2:5:3 holds
BEFORE, AFTER = [6, 3, 1], [2, 5, 3]
TABLES = [(0, 60, 3), (10_000, 10_045, 3), (20_000, 20_024, 2)]  # (first id, stop, S)
LR = 1e-9


def loader(
    folders: list[str], mode: str, rank: int, world: int, resumed: bool
) -> StreamingDataLoader:
    datasets = [
        StreamingDataset(
            folder, columns=["id"], num_splits=s, shuffle_seed=k, rank=rank, world_size=world
        )
        for k, (folder, (_, _, s)) in enumerate(zip(folders, TABLES, strict=True))
    ]
    if mode == "schedule":
        mix = MixedDataset(datasets, BEFORE, schedule=[(SWITCH, AFTER)])
    else:  # set_weights: a resume adopts the saved weights and phases
        mix = MixedDataset(datasets, None if resumed else BEFORE)
    return StreamingDataLoader(
        mix, global_batch_size=G, num_workers=2 if world > 1 else 0, read_size=G
    )


def train(dl: StreamingDataLoader, theta: float, steps: int, on_step: Any) -> list[float]:
    """`steps` SGD steps of loss = mean over the global batch of (theta * id - 1)^2."""
    losses = []
    while len(losses) < steps:
        for batch in dl:
            on_step(dl)
            x = batch["id"].to(torch.float64)
            parts = torch.stack([((theta * x - 1) ** 2).sum(), (2 * (theta * x - 1) * x).sum()])
            if dist.is_initialized():
                dist.all_reduce(parts)
            loss, grad = (parts / G).tolist()
            theta -= LR * grad
            losses.append(loss)
            if len(losses) == steps:
                break
    dl.theta = theta  # type: ignore[attr-defined]
    return losses


def reweight(dl: StreamingDataLoader, rank: int, notes: dict[str, Any]) -> None:
    """After global step 1 (the workers read a few steps ahead, not to SWITCH): once with
    other weights on rank 1 (every rank must refuse), then alike."""
    if dl.global_step != 1 or "mismatch" in notes:
        return
    try:
        dl.set_weights(AFTER if rank == 0 else BEFORE, at_step=SWITCH)
    except ValueError as err:
        notes["mismatch"] = str(err)
    dl.set_weights(AFTER, at_step=SWITCH)


def hook_for(mode: str, rank: int, notes: dict[str, Any]) -> Any:
    """What runs before each step: the reweighting in set_weights mode, else nothing."""
    if mode != "set_weights":
        return lambda dl: None
    return lambda dl: reweight(dl, rank, notes)


def run_rank(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    for mode, save_at in job["modes"].items():
        notes: dict[str, Any] = {}
        resume = job.get("resume")
        dl = loader(job["folders"], mode, rank, world, resume is not None)
        theta = 1e-4
        if resume:
            saved = load(Path(resume, f"{mode}.json"))
            theta = saved.pop("theta")
            dl.load_state_dict(saved)
        hook = hook_for(mode, rank, notes)
        steps = job["steps"] - (dl.global_step if resume else 0)
        losses = train(dl, theta, save_at if not resume else steps, hook)
        if not resume:
            if rank == 0:
                save({**dl.state_dict(), "theta": dl.theta}, Path(job["save"], f"{mode}.json"))
            losses += train(dl, dl.theta, 2, hook)  # read past the checkpoint: lost at the kill
        out[mode] = {"losses": losses, **notes}
        dl.close()
    Path(job["out"], f"rank{rank}.json").write_bytes(orjson.dumps(out))
    dist.barrier()
    if not job.get("resume"):
        os.kill(os.getpid(), signal.SIGKILL)  # the job is lost, no clean shutdown
    dist.destroy_process_group()
