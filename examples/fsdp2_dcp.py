"""FSDP2 + torch.distributed.checkpoint: shard the model, save mid-epoch, resume on fewer ranks.

``train_ddp.py`` keeps a full copy of the model on every rank. When the model does not
fit, FSDP2 (``torch.distributed.fsdp.fully_shard``) shards parameters, gradients and
optimizer state across ranks, and torch.distributed.checkpoint (DCP) saves each rank's
shards in parallel and reshards them on load, so a checkpoint written by 4 ranks loads
on 2. The loader state is per split and the same on every rank: it is saved once,
beside the DCP folder, with ``loader.checkpoint``, and it too resumes on any W the layout
allows (any W <= G when the global batch G is a multiple of ``num_splits``). Together: the whole job moves to another world size mid-epoch.

Runs on CPU with Gloo (checked with torch 2.13: ``fully_shard`` over a CPU
``DeviceMesh``, and DCP, both work on Gloo), and on GPUs with NCCL unchanged.

    python examples/fsdp2_dcp.py                      # W=4 trains 40 steps, saves; W=2 finishes
    torchrun --standalone --nproc-per-node 4 examples/fsdp2_dcp.py --stop-after 40
    torchrun --standalone --nproc-per-node 2 examples/fsdp2_dcp.py --resume
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from har_data import FEATURES, LABEL, ROW_ID, default_spec, load_test_set
from local_launch import launch
from row_ledger import RowLedger
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from train_ddp import (
    DTYPES,
    REPO,
    TrainConfig,
    build_model,
    cpu_threads,
    ensure_default_tables,
    make_loader,
    pick_device,
)

from loader.checkpoint import load as load_loader_state
from loader.checkpoint import save as save_loader_state


@dataclass(frozen=True)
class ShardedJob:
    """A TrainConfig plus where to stop (None: train to the end)."""

    train: TrainConfig
    stop_after: int | None = None


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """One FSDP unit per Linear layer, then the root: each layer's weights are gathered
    only while it runs, which is what keeps the peak memory at one layer, not the model."""
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def save(folder: Path, model, optimizer, dl, ledger: RowLedger, step: int, rank: int) -> None:
    """DCP writes every rank's shards; rank 0 then writes the loader state (the commit mark)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "rows_seen": ledger.committed}
    dcp.save(state, checkpoint_id=str(folder / "dcp"))
    if rank == 0:
        (folder / "step.json").write_text(json.dumps({"step": step}))
        save_loader_state(dl.state_dict(), folder / "loader.json")
    dist.barrier()


def restore(folder: Path, model, optimizer, dl, ledger: RowLedger) -> int:
    """Load the shards resharded to this world size, then the loader state; return the step."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "rows_seen": ledger.committed}
    dcp.load(state, checkpoint_id=str(folder / "dcp"))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    dl.load_state_dict(load_loader_state(folder / "loader.json"))
    return int(json.loads((folder / "step.json").read_text())["step"])


def run_rank(rank: int, world_size: int, job: ShardedJob, store_path: str | None = None) -> None:
    device, backend = pick_device(int(os.environ.get("LOCAL_RANK", rank)), world_size)
    torch.set_num_threads(cpu_threads(world_size))
    store = dist.FileStore(store_path, world_size) if store_path else None
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    try:
        ensure_default_tables(job.train, rank)
        _train(rank, world_size, job, device)
    finally:
        dist.destroy_process_group()


def _train(rank: int, world_size: int, job: ShardedJob, device: torch.device) -> None:
    cfg, dtype = job.train, DTYPES[job.train.dtype]
    folder = Path(cfg.checkpoint_dir or REPO / "checkpoints" / "fsdp2-dcp")
    torch.manual_seed(cfg.seed)
    model = shard(
        build_model().to(device=device, dtype=dtype), init_device_mesh(device.type, (world_size,))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    dl, num_rows = make_loader(cfg, world_size)
    ledger = RowLedger(cfg.epochs, num_rows)
    step = restore(folder, model, optimizer, dl, ledger) if cfg.resume else 0
    resumed_from = step
    first_epoch = dl.state_dict()["epoch"]
    for epoch in range(first_epoch, cfg.epochs):
        for batch in dl:
            optimizer.zero_grad(set_to_none=True)
            logits = model(batch[FEATURES].to(device=device, dtype=dtype))
            F.cross_entropy(logits, batch[LABEL].to(device)).backward()  # reduce-scatter: mean
            optimizer.step()
            ledger.add(epoch, batch[ROW_ID])
            step += 1
            if step == job.stop_after:
                ledger.commit(device)
                save(folder, model, optimizer, dl, ledger, step, rank)
                if rank == 0:
                    print(f"W={world_size}: saved after step {step} (epoch {epoch}) to {folder}")
                return
    ledger.commit(device)
    x, y = load_test_set(cfg.tables)
    with torch.no_grad():  # every rank runs the forward: FSDP gathers the layers it needs
        pred = model(torch.from_numpy(x).to(device=device, dtype=dtype)).argmax(1).cpu()
    if rank == 0:
        accuracy = float((pred == torch.from_numpy(y)).double().mean())
        print(f"W={world_size}: steps {resumed_from + 1}-{step}; test accuracy {accuracy:.2%}")
        for e in ledger.summary():
            print(f"  epoch {e['epoch']}: {e['rows']} rows, {e['distinct']} distinct, "
                  f"each used {e['min']}-{e['max']} time(s)")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default=default_spec(REPO).uri)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--checkpoint-dir", default=str(REPO / "checkpoints" / "fsdp2-dcp"))
    p.add_argument("--stop-after", type=int, default=None, help="save after this step and stop")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    p.add_argument("--nproc", type=int, default=4, help="ranks of the first phase (no torchrun)")
    p.add_argument("--resume-nproc", type=int, default=2, help="ranks of the second phase")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = TrainConfig(db=args.db, epochs=args.epochs, dtype=args.dtype, label="fsdp2",
                      checkpoint_dir=args.checkpoint_dir, resume=args.resume, progress=False,
                      make_tables=args.db == default_spec(REPO).uri)  # fmt: skip
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun: one phase per command
        run_rank(
            int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), ShardedJob(cfg, args.stop_after)
        )
        return 0
    shutil.rmtree(args.checkpoint_dir, ignore_errors=True)  # no shards left from another W
    launch(run_rank, ShardedJob(cfg, args.stop_after or 40), args.nproc)
    launch(run_rank, ShardedJob(replace(cfg, resume=True)), args.resume_nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
