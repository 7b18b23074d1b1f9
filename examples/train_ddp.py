"""Train the 561 → 1024 → 1024 → 6 MLP with DDP, reading through elastic-loader.

Run it under torchrun (one machine or many)::

    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py --epochs 5

or let it start its own ranks on this machine (``--nproc 4``), as ``main_job.py`` does.
With the default ``--db`` it reads the synthetic HAR-shaped tables under ``data/``, which
rank 0 makes on first use (``har_data.py``; a few seconds); another ``--db`` must hold them.

Why the runs at W = 1, 2, 4 end with the same weights:

* the loader gives global batch t the same rows for every W (G a multiple of
  ``num_splits``; rank r takes rows [r·G//W, (r+1)·G//W) of it), so only the split of the
  work changes, W = 3 or 7 included;
* each rank sums its loss over its rows and multiplies by ``dl.loss_scale`` (W / rows of
  the global step), and DDP averages the gradients over the W ranks: that is the mean over
  the global batch, the same update as one rank computing it alone, even where the
  per-rank batches differ by a row (G % W != 0). The sums are done in a different order,
  which in float32 leaves differences that grow with training (~7e-5 after 145 steps)
  and in float64 stays at ~1e-16 (``--dtype float64``);
* the starting weights come from one seed, and DDP broadcasts rank 0's copy anyway.

Checkpoints (``--checkpoint-every k``) hold the model, the optimizer, the loader state
(``loader.checkpoint``, per split so any W can resume it) and a ledger of which rows
trained the model in each epoch, so a resumed run can show every row was used once.
``--checkpoint-dir`` is a local folder or an object-store prefix (``s3://bucket/ckpt``,
reached with the same ``--storage-option``s as the table): ``model-step-K.pt`` first,
then ``loader-step-K.json``, whose presence marks the checkpoint complete.
``--crash-at-step K --crash-rank R`` makes rank R SIGKILL itself after step K: a real
crash at a known place, not a race between a timer and the training loop.
``--stall-at-step K`` makes rank R stop (SIGSTOP) there instead: a frozen node, which a
test then kills whole (its torchrun agent and every rank); ``--hold-at-step K:W`` holds a
W-rank job at step K until torchrun's agent restarts it on another node count
(``examples/drills.py``).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from drills import crash_if_asked, hold_if_asked, parse_hold
from har_data import (
    FEATURES,
    LABEL,
    ROW_ID,
    TableSpec,
    default_spec,
    ensure_synthetic,
    load_test_set,
    open_table,
)
from local_launch import launch
from progress import ProgressBar
from row_ledger import RowLedger
from torch.nn.parallel import DistributedDataParallel

from loader import StreamingDataLoader, StreamingDataset, checkpoint_io
from loader.checkpoint import latest as latest_loader_state
from loader.checkpoint import load as load_loader_state
from loader.checkpoint import save as save_loader_state

REPO = Path(__file__).resolve().parent.parent
DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class TrainConfig:
    """Everything one run needs; pickled to every rank, so plain values only."""

    db: str
    train_table: str = "har_train"
    test_table: str = "har_test"
    storage_options: tuple[tuple[str, str], ...] = ()
    epochs: int = 5
    global_batch: int = 256
    num_splits: int = 8
    lr: float = 0.05
    dtype: str = "float32"
    seed: int = 0
    shuffle_seed: int = 0
    num_workers: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    crash_at_step: int | None = None
    stall_at_step: int | None = None
    crash_rank: int = 0
    hold_at_step: tuple[tuple[int, int], ...] = ()
    out: str | None = None
    run_id: str | None = None
    telemetry_url: str | None = None
    label: str = "train"
    progress: bool = True
    make_tables: bool = False  # rank 0 writes the synthetic tables at ``db`` if missing

    @property
    def tables(self) -> TableSpec:
        return TableSpec(self.db, self.train_table, self.test_table, self.storage_options)

    @property
    def options(self) -> dict[str, str] | None:
        """Storage options for the table and for checkpoints on object storage."""
        return dict(self.storage_options) or None


def build_model() -> torch.nn.Module:
    """The tutorial's network: 1,631,238 parameters."""
    return torch.nn.Sequential(
        torch.nn.Linear(561, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 6),
    )


def cpu_threads(world_size: int) -> int:
    """Each rank gets its share of the cores, as if it were its own machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


def pick_device(local_rank: int, world_size: int) -> tuple[torch.device, str]:
    """NCCL when every rank has a GPU of its own; else Gloo (CPU, or ranks sharing a GPU)."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % count)
        return device, "nccl" if count >= world_size else "gloo"
    return torch.device("cpu"), "gloo"


def _join(where: str, name: str) -> str:
    """A file in a local folder or under an object-store prefix."""
    return where.rstrip("/") + "/" + name


def model_file_of(loader_file: str) -> str:
    """``…/loader-step-K.json`` → ``…/model-step-K.pt`` (written just before it)."""
    head, _, name = str(loader_file).rpartition("/")
    return _join(head, name.replace("loader-step-", "model-step-").removesuffix(".json") + ".pt")


def latest_checkpoint(where: str | Path, options: dict[str, str] | None = None) -> str | None:
    """The newest complete checkpoint: its loader state, written after the model file."""
    found = latest_loader_state(str(where), storage_options=options)
    return None if found is None else str(found)


def save_checkpoint(
    where: str, step: int, epoch: int, model, optimizer, dl, ledger, options=None
) -> str:
    """Rank 0 writes model, optimizer and ledger, then the loader state (the commit mark).

    Each is one atomic write (a renamed temporary file, or one object), locally or on S3.
    """
    blob = {
        "step": step,
        "epoch": epoch,
        "model": model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rows_seen": ledger.committed,
    }
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    state_file = _join(where, f"loader-step-{step:06d}.json")
    model_file = checkpoint_io.location(model_file_of(state_file))
    checkpoint_io.write(model_file, buffer.getvalue(), options)
    return str(save_loader_state(dl.state_dict(), state_file, storage_options=options))


def load_model_blob(loader_file: str, device, options=None) -> dict[str, Any]:
    stored = checkpoint_io.read(checkpoint_io.location(model_file_of(loader_file)), options)
    return torch.load(io.BytesIO(stored.data), map_location=device)


def agreed_checkpoint(where: str, rank: int, options=None) -> str | None:
    """Rank 0 picks the checkpoint and tells the others, so every rank resumes the same one."""
    choice = [(latest_checkpoint(where, options) or "") if rank == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    return choice[0] or None


def replica_spread(model: torch.nn.Module) -> float:
    """Largest difference of any weight between any two ranks' replicas (0.0: identical)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return float((high - low).max())


def test_accuracy(model: torch.nn.Module, cfg: TrainConfig, device, dtype) -> float:
    x, y = load_test_set(cfg.tables)
    with torch.no_grad():
        logits = model(torch.from_numpy(x).to(device=device, dtype=dtype))
    return float((logits.argmax(1).cpu() == torch.from_numpy(y)).double().mean())


def steps_per_epoch(num_rows: int, cfg: TrainConfig) -> int:
    """Global steps in one epoch: the plan's S·⌊N/S⌋ rows in global batches, last one short."""
    return math.ceil(cfg.num_splits * (num_rows // cfg.num_splits) / cfg.global_batch)


def run_rank(rank: int, world_size: int, cfg: TrainConfig, store_path: str | None = None) -> None:
    """One rank of the job: join the group, train, checkpoint, report (rank 0 writes)."""
    if cfg.telemetry_url:  # set here: forkserver ranks do not see the driver's later env
        os.environ["ELASTIC_LOADER_TELEMETRY"] = cfg.telemetry_url
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device, backend = pick_device(local_rank, world_size)
    torch.set_num_threads(cpu_threads(world_size))
    store = dist.FileStore(store_path, world_size) if store_path else None
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    try:
        ensure_default_tables(cfg, rank)
        result = _train(rank, world_size, cfg, device)
        if rank == 0 and cfg.out:
            result.update(backend=backend, threads=torch.get_num_threads())
            Path(cfg.out, "result.json").write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()


def ensure_default_tables(cfg: TrainConfig, rank: int) -> None:
    """With ``make_tables`` (the default ``data/`` of this script's command line), rank 0
    makes the synthetic tables unless they are there (a fresh clone has none, and torchrun
    starts the ranks with no driver to make them); the other ranks wait for it."""
    if not cfg.make_tables:
        return
    if rank == 0:
        ensure_synthetic(cfg.tables)
    dist.barrier()


def make_loader(cfg: TrainConfig, world_size: int) -> tuple[StreamingDataLoader, int]:
    """This rank's loader: G / W rows a batch from the rank's share of ``num_splits`` splits.

    Returns:
        The loader, and N (the train table's row count, for the row ledger).
    """
    table = open_table(cfg.tables, cfg.train_table)
    ds = StreamingDataset(
        table, columns=[FEATURES, LABEL, ROW_ID], num_splits=cfg.num_splits,
        shuffle=True, shuffle_seed=cfg.shuffle_seed,
    )  # fmt: skip
    dl = StreamingDataLoader(
        ds, global_batch_size=cfg.global_batch, num_workers=cfg.num_workers,
        drop_last=False, run_id=cfg.run_id, total_epochs=cfg.epochs,
    )  # fmt: skip
    return dl, table.count_rows()


@dataclass
class RankJob:
    """One rank's training state; the methods are the phases of ``run_rank``."""

    cfg: TrainConfig
    rank: int
    world_size: int
    device: torch.device
    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    dl: StreamingDataLoader
    ledger: RowLedger
    num_rows: int
    step: int = 0
    first_epoch: int = 0
    resumed_from: int | None = None

    @classmethod
    def build(cls, cfg: TrainConfig, rank: int, world_size: int, device: torch.device) -> RankJob:
        torch.manual_seed(cfg.seed)  # the same starting weights on every rank
        model = DistributedDataParallel(build_model().to(device=device, dtype=DTYPES[cfg.dtype]))
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        dl, num_rows = make_loader(cfg, world_size)
        ledger = RowLedger(cfg.epochs, num_rows)
        return cls(cfg, rank, world_size, device, model, optimizer, dl, ledger, num_rows)

    def resume(self) -> None:
        """Load the latest complete checkpoint, if asked and one exists."""
        where, options = self.cfg.checkpoint_dir, self.cfg.options
        found = agreed_checkpoint(where, self.rank, options) if where else None
        if not found:
            return
        blob = load_model_blob(found, self.device, options)
        self.model.module.load_state_dict(blob["model"])
        self.optimizer.load_state_dict(blob["optimizer"])
        self.ledger.committed.copy_(blob["rows_seen"])
        self.dl.load_state_dict(load_loader_state(found, storage_options=options))
        self.step = self.resumed_from = blob["step"]
        # The loader's epoch, not the one saved beside it: a state saved after an epoch's
        # last batch resumes at the start of the next epoch.
        self.first_epoch = self.dl.state_dict()["epoch"]

    def train(self, bar: ProgressBar | None) -> float:
        """Run the remaining epochs; return this rank's seconds."""
        dtype = DTYPES[self.cfg.dtype]
        start = time.perf_counter()
        for epoch in range(self.first_epoch, self.cfg.epochs):
            for batch in self.dl:
                x = batch[FEATURES].to(device=self.device, dtype=dtype)
                self.optimizer.zero_grad(set_to_none=True)
                summed = F.cross_entropy(
                    self.model(x), batch[LABEL].to(self.device), reduction="sum"
                )
                # loss_scale = W / rows of this global step: DDP's average over the W ranks
                # then makes the gradient the global batch's mean, equal slices or not
                (summed * self.dl.loss_scale).backward()
                self.optimizer.step()
                self.ledger.add(epoch, batch[ROW_ID])
                self.step += 1
                self.checkpoint_if_due(epoch)
                cfg = self.cfg
                crash_if_asked(cfg.crash_rank, cfg.crash_at_step, cfg.stall_at_step,
                               self.rank, self.step)  # fmt: skip
                hold_if_asked(cfg.hold_at_step, self.step, self.device)
                if bar:
                    bar.update(self.step, f"epoch {epoch}")
        return time.perf_counter() - start

    def checkpoint_if_due(self, epoch: int) -> None:
        every, where = self.cfg.checkpoint_every, self.cfg.checkpoint_dir
        if not where or not every or self.step % every:
            return
        self.ledger.commit(self.device)
        if self.rank == 0:
            written = save_checkpoint(
                where, self.step, epoch, self.model, self.optimizer, self.dl, self.ledger,
                self.cfg.options,
            )  # fmt: skip
            self.dl.note_checkpoint_saved(written)
        dist.barrier()  # nobody runs ahead of a checkpoint that is not yet on disk

    def report(self, seconds: float) -> dict[str, Any]:
        """Collective: every rank calls it; rank 0's dict has the test accuracy."""
        elapsed = torch.tensor(seconds, dtype=torch.float64, device=self.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the job is as slow as its slowest rank
        self.ledger.commit(self.device)
        spread = replica_spread(self.model)
        accuracy = float("nan")
        if self.rank == 0:
            accuracy = test_accuracy(
                self.model.module, self.cfg, self.device, DTYPES[self.cfg.dtype]
            )
        return {
            "config": asdict(self.cfg),
            "world_size": self.world_size,
            "steps": self.step,
            "seconds": float(elapsed),
            "accuracy": accuracy,
            "replica_spread": spread,
            "rows_per_epoch": self.ledger.summary(),
            "resumed_from_step": self.resumed_from,
            "rows_in_plan": self.cfg.num_splits * (self.num_rows // self.cfg.num_splits),
        }


def _train(rank: int, world_size: int, cfg: TrainConfig, device: torch.device) -> dict[str, Any]:
    job = RankJob.build(cfg, rank, world_size, device)
    if cfg.resume:
        job.resume()
    total = steps_per_epoch(job.num_rows, cfg) * cfg.epochs
    bar = ProgressBar(total, cfg.label) if rank == 0 and cfg.progress else None
    dist.barrier()
    result = job.report(job.train(bar))
    job.dl.close()  # flush the last telemetry: spawned ranks skip atexit
    if bar:
        bar.close(f"replicas differ by {result['replica_spread']:.1e}")
    if rank == 0 and cfg.out:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        torch.save(job.model.module.state_dict(), Path(cfg.out, "weights.pt"))
    return result


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_args(argv: Sequence[str] | None = None) -> tuple[TrainConfig, int]:
    """The command line as a config, plus ``--nproc`` (ranks to start without torchrun)."""
    spec = default_spec(REPO)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default=spec.uri, help="LanceDB URI holding the tables")
    p.add_argument("--train-table", default=spec.train)
    p.add_argument("--test-table", default=spec.test)
    p.add_argument(
        "--storage-option", dest="storage_options", type=_pair, action="append", default=[],
        help="KEY=VALUE for LanceDB on object storage (repeat), e.g. region=eu-west-1",
    )  # fmt: skip
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=256, help="G = W × per-rank batch")
    p.add_argument("--num-splits", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--checkpoint-dir", default=None, help="a folder or s3://bucket/prefix")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--crash-at-step", type=int, default=None)
    p.add_argument("--stall-at-step", type=int, default=None, help="SIGSTOP instead of SIGKILL")
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument(
        "--hold-at-step", type=parse_hold, action="append", default=[], metavar="STEP:W",
        help="every rank of a W-rank job waits at STEP until the launcher changes the job",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="folder for rank 0's result.json and weights.pt")
    p.add_argument("--run-id", default=None, help="name of the run on the dashboard")
    p.add_argument("--nproc", type=int, default=1, help="ranks to start (ignored under torchrun)")
    args = vars(p.parse_args(argv))
    nproc = args.pop("nproc")
    args["storage_options"] = tuple(args["storage_options"])
    args["hold_at_step"] = tuple(args["hold_at_step"])
    args["make_tables"] = args["db"] == spec.uri  # another --db is the user's, never written
    return TrainConfig(**args), nproc


def main(argv: Sequence[str] | None = None) -> int:
    cfg, nproc = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), cfg)
        return 0
    launch(run_rank, cfg, nproc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
