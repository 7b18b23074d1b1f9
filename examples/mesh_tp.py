"""FSDP2 + tensor parallel on a (dp, tp) DeviceMesh: crash, resume on another DP size.

The loader is built with ``mesh=``: the data is split over the mesh's ``dp`` dim, and the
two tensor-parallel peers of a DP rank get identical batches. An MLP in float64 is
sharded with ``parallelize_module`` (Colwise/Rowwise) over ``tp`` and ``fully_shard`` over
``dp``; DCP saves the model, the optimizer and the loader together every few steps. One
process SIGKILLs itself (a real crash, at a known place); the job resumes from the newest
complete checkpoint on a mesh of another DP size (same TP) and finishes the epoch with the
same weights, to float64 rounding, as a run that never stopped, every row trained on once.

    python examples/mesh_tp.py --dp 2 --crash-at-step 9 --out /tmp/mesh   # crashes
    python examples/mesh_tp.py --dp 1 --resume --out /tmp/mesh             # finishes
    python examples/mesh_tp.py --dp 3 --out /tmp/mesh-ref                  # never stops

Runs on CPU with Gloo (checked with torch 2.13), and with NCCL unchanged on GPUs.
Each run writes ``rows-*.jsonl`` (the rows each DP rank trained on, by step) and
``weights.pt`` (the full weights at the end) to ``--out``, and prints its verdict: whether
the tensor-parallel peers read the same rows, and whether each row was trained on once
(across the crash, when the first run's logs are in the same ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from local_launch import launch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from loader import StreamingDataLoader, StreamingDataset

ROWS, NUM_SPLITS, GLOBAL_BATCH, FEATURES, HIDDEN = 720, 12, 24, 8, 16  # 30 steps
SAVE_EVERY, LR, TP = 4, 0.05, 2


def features(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets derived from the row ids (so the table holds only ids)."""
    x = torch.sin(ids.to(torch.float64)[:, None] * 0.37 + torch.arange(FEATURES) * 1.3)
    return x, x.sum(dim=1, keepdim=True).cos()


def build(mesh: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same initial weights on every process and every run
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN, dtype=torch.float64),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 1, dtype=torch.float64),
    )
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def complete_checkpoints(folder: Path) -> list[Path]:
    """DCP writes `.metadata` last: a folder without it is a save cut short."""
    found = [p for p in folder.glob("step-*") if (p / ".metadata").exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def rank_main(rank: int, world_size: int, job: dict[str, Any], store_path: str) -> None:
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        train(rank, job)
    finally:
        dist.destroy_process_group()


def train(rank: int, job: dict[str, Any]) -> None:
    mesh = init_device_mesh("cpu", (job["dp"], TP), mesh_dim_names=("dp", "tp"))
    out, folder = Path(job["out"]), Path(job["checkpoints"])
    ds = StreamingDataset(job["table"], columns=["id"], num_splits=NUM_SPLITS, mesh=mesh)
    dl = StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH)
    model, optimizer = build(mesh)
    step = 0
    if job["resume"]:
        newest = complete_checkpoints(folder)[-1]
        model_sd, optim_sd = get_state_dict(model, optimizer)
        states = {"model": model_sd, "optim": optim_sd, "dataloader": dl}
        dcp.load(states, checkpoint_id=str(newest))
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        step = int(newest.name.split("-")[1])
    log = (
        out
        / f"rows-dp{ds.rank}-tp{mesh.get_local_rank('tp')}-{'resume' if job['resume'] else 'first'}.jsonl"
    )
    with log.open("a") as rows:
        for batch in dl:
            x, y = features(batch["id"])
            # The summed loss over this DP rank's rows, scaled so that FSDP's mean over DP
            # ranks is the global batch's mean: the same gradient on any DP size.
            loss = ((model(x) - y) ** 2).sum() * ds.world_size / GLOBAL_BATCH
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            rows.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
            rows.flush()
            if step % SAVE_EVERY == 0:
                model_sd, optim_sd = get_state_dict(model, optimizer)
                states = {"model": model_sd, "optim": optim_sd, "dataloader": dl}
                dcp.save(states, checkpoint_id=str(folder / f"step-{step}"))
            if step == job["crash_at_step"] and rank == job["crash_rank"]:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no goodbye
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in full.items()}, out / "weights.pt")


def logged_rows(out: Path, tag: str, upto: int | None = None) -> tuple[bool, list[int]]:
    """Whether every DP rank's TP peers logged the same rows in run ``tag``, and the rows
    the DP ranks trained on (up to step ``upto``)."""
    same, rows = True, []
    for log in sorted(out.glob(f"rows-*-tp0-{tag}.jsonl")):
        peers = [log.with_name(log.name.replace("-tp0-", f"-tp{t}-")) for t in range(1, TP)]
        same = same and all(p.read_bytes() == log.read_bytes() for p in peers)
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if upto is None or entry["step"] <= upto:
                rows.extend(entry["ids"])
    return same, rows


def verdict(out: Path, resumed_from: int | None) -> bool:
    """Print what the run shows; False when a check failed."""
    same, rows = logged_rows(out, "first" if resumed_from is None else "resume")
    print(f"tensor-parallel peers read the same rows: {'OK' if same else 'NO, they differ'}")
    once = len(set(rows)) == len(rows)
    if resumed_from is None:
        once = once and sorted(rows) == list(range(ROWS))
        print(f"every row trained on once: {'OK' if once else 'NO'} ({len(rows)} of {ROWS})")
    elif not any(out.glob("rows-*-tp0-first.jsonl")):
        print(f"{len(rows)} rows trained on since step {resumed_from}, {len(set(rows))} distinct")
    else:  # the crashed run's logs are beside this one's: count across the crash
        rows += logged_rows(out, "first", upto=resumed_from)[1]
        once = sorted(rows) == list(range(ROWS))
        print(f"every row trained on once across the crash: {'OK' if once else 'NO'}")
    return same and once


def make_table(uri: str) -> None:
    if not Path(uri).exists():
        lance.write_dataset(pa.table({"id": np.arange(ROWS, dtype=np.int64)}), uri)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=2, help="data-parallel size (TP is 2)")
    parser.add_argument("--out", default="/tmp/elastic-loader-mesh", help="logs and weights")
    parser.add_argument("--checkpoints", default=None, help="default: <out>/../checkpoints")
    parser.add_argument("--table", default=None, help="default: <out>/../rows.lance")
    parser.add_argument("--resume", action="store_true", help="from the newest checkpoint")
    parser.add_argument("--crash-at-step", type=int, default=None)
    parser.add_argument("--crash-rank", type=int, default=3)
    opts = parser.parse_args(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    job = {
        "dp": opts.dp,
        "out": str(out),
        "checkpoints": opts.checkpoints or str(out.parent / "checkpoints"),
        "table": opts.table or str(out.parent / "rows.lance"),
        "resume": opts.resume,
        "crash_at_step": opts.crash_at_step,
        "crash_rank": opts.crash_rank,
    }
    make_table(job["table"])
    for old in out.glob(f"rows-*-{'resume' if opts.resume else 'first'}.jsonl"):
        old.unlink()  # an earlier run's logs of the same kind (the ranks append)
    resumed_from = None
    if opts.resume:
        saved = complete_checkpoints(Path(job["checkpoints"]))
        if not saved:
            raise SystemExit(f"--resume: no complete checkpoint in {job['checkpoints']}")
        resumed_from = int(saved[-1].name.split("-")[1])
    launch(rank_main, job, opts.dp * TP)
    return 0 if verdict(out, resumed_from) else 1


if __name__ == "__main__":
    raise SystemExit(main())
