"""Pretrain a tiny causal LM on packed tokens; crash on 4 ranks, resume on 2, same loss curve.

The text is Python's own standard library (``sysconfig.get_paths()["stdlib"]``: it ships
with every Python, nothing is downloaded), tokenized at the byte level: tokens 0-255, and
256 as end of document. Each source file is a document of a LanceDB table; the loader
packs them into blocks of ``--seq-len`` tokens (``pack_sequences``, ``eos_id``).

Three runs with real processes (torch.multiprocessing, Gloo on CPU), in float64:

1. uninterrupted on W = 4;
2. W = 4 again, a checkpoint every ``--checkpoint-every`` steps (model, optimizer, loader
   state), and rank 1 SIGKILLs itself after step ``--crash-at-step``;
3. a resume of the last checkpoint on W = 2.

Each step's loss is the mean over the global batch's tokens (the ranks sum their token
losses and counts and all-reduce them), so the curve does not depend on W except for the
order of float64 sums. The example checks that run 2 up to its checkpoint followed by run
3 gives run 1's loss at every step (to 1e-9), and that in every epoch each block of the
plan trained the model exactly once (no block lost or repeated across the crash).

    python examples/pretrain_lm.py --out /tmp/pretrain          # ~1 min on 2 cores
    python examples/pretrain_lm.py --out /tmp/pretrain --quick  # what CI runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone

from loader import StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save
from loader.read.packed_reader import IGNORE_INDEX

EOS = 256
VOCAB = 257
NUM_SPLITS = 4
TABLE = "stdlib"


def build_table(db: Path, max_files: int, max_doc_bytes: int) -> int:
    """The first `max_files` stdlib modules (sorted), each cut to `max_doc_bytes`, as token lists."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:max_files]
    docs = [np.frombuffer(f.read_bytes()[:max_doc_bytes], dtype=np.uint8) for f in files]
    table = pa.table(
        {
            "path": [f.name for f in files],
            "tokens": pa.array([d.astype(np.int16) for d in docs], pa.list_(pa.int16())),
        }
    )
    lancedb.connect(str(db)).create_table(TABLE, table, mode="overwrite")
    return sum(len(d) for d in docs)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Two pre-norm transformer layers; attention is causal and stays inside a document."""

    def __init__(self, seq_len: int, dim: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids, docs = batch["input_ids"], batch["document_ids"]
        t = ids.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        mask = (causal & (docs.unsqueeze(2) == docs.unsqueeze(1))).unsqueeze(1)  # (B, 1, T, T)
        x = self.tokens(ids) + self.positions(batch["position_ids"])
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def block_hash(ids: torch.Tensor) -> str:
    return hashlib.blake2b(ids.numpy().tobytes(), digest_size=8).hexdigest()


def all_reduce_grads(model: nn.Module, loss_sum: float, tokens: float) -> torch.Tensor:
    """One all-reduce of every gradient and the (loss sum, token count); grads become means."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat(
        [g.reshape(-1) for g in grads] + [torch.tensor([loss_sum, tokens], dtype=torch.float64)]
    )
    dist.all_reduce(flat)
    totals = flat[-2:]
    for grad, part in zip(grads, flat[:-2].split([g.numel() for g in grads]), strict=True):
        grad.copy_(part.view_as(grad) / totals[1])
    return totals


def run_rank(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        train(rank, world, job)
    finally:
        dist.destroy_process_group()


def train(rank: int, world: int, job: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = TinyLM(job["seq_len"]).double()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    table = lancedb.connect(job["db"]).open_table(TABLE)
    ds = StreamingDataset(
        table, columns=["tokens"], num_splits=NUM_SPLITS, shuffle_seed=1,
        pack_sequences=job["seq_len"], eos_id=EOS,
    )  # fmt: skip
    dl = StreamingDataLoader(
        ds, batch_size=job["global_batch"] // world, total_epochs=job["epochs"]
    )  # the dashboard's "epoch x of N" and job ETA
    step = 0
    ckpt = Path(job["checkpoints"])
    if job.get("resume"):
        saved = torch.load(ckpt / "model.pt")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        dl.load_state_dict(load(ckpt / "loader.ckpt"))
        step = saved["step"]
    log = (Path(job["log"]) / f"rank{rank}.jsonl").open("a")
    first = dl.state_dict()["epoch"]  # the position: where the next batch comes from
    for epoch in range(first, job["epochs"]):
        for batch in dl:
            logits = model(batch)
            labels = batch["labels"]
            loss = F.cross_entropy(
                logits.view(-1, VOCAB), labels.view(-1), ignore_index=IGNORE_INDEX, reduction="sum"
            )
            opt.zero_grad()
            loss.backward()
            totals = all_reduce_grads(model, loss.item(), float((labels != IGNORE_INDEX).sum()))
            opt.step()
            step += 1
            record = {
                "step": step,
                "epoch": epoch,
                "loss": float(totals[0] / totals[1]),
                "blocks": [block_hash(row) for row in batch["input_ids"]],
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            checkpoint_or_crash(job, rank, step, model, opt, dl, log)
    log.close()


def checkpoint_or_crash(
    job: dict[str, Any], rank: int, step: int, model: nn.Module, opt: Any, dl: Any, log: Any
) -> None:
    """Every `checkpoint_every` steps rank 0 saves model, optimizer and loader state; at
    `crash_at_step` rank `crash_rank` SIGKILLs itself (a real crash, at a known place)."""
    ckpt = Path(job["checkpoints"])
    if job.get("checkpoint_every") and step % job["checkpoint_every"] == 0 and rank == 0:
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        torch.save(state, ckpt / "model.pt.tmp")
        save(dl.state_dict(), ckpt / "loader.ckpt")
        os.replace(ckpt / "model.pt.tmp", ckpt / "model.pt")
    if step == job.get("crash_at_step") and rank == job.get("crash_rank"):
        log.close()
        os.kill(os.getpid(), signal.SIGKILL)


def launch(world: int, job: dict[str, Any], target: Any = None) -> bool:
    """Run `world` ranks of `target` (default: this example's `run_rank`); False if they crashed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    Path(job["log"]).mkdir(parents=True, exist_ok=True)
    target = run_rank if target is None else target
    try:
        mp.start_processes(target, (world, port, job), nprocs=world, start_method="forkserver")
    except mp.ProcessExitedException:
        return False
    return True


def read_logs(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Per step, every rank's record (rank 0's loss; all ranks' blocks)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], []).append(record)
    return steps


def blocks_per_epoch(steps: dict[int, list[dict[str, Any]]]) -> dict[int, Counter[str]]:
    out: dict[int, Counter[str]] = {}
    for records in steps.values():
        for r in records:
            out.setdefault(r["epoch"], Counter()).update(r["blocks"])
    return out


def token_accounting(job: dict[str, Any], epochs: int) -> dict[int, dict[str, int]]:
    """Per epoch: tokens (eos included) of the plan's documents, in blocks, and dropped."""
    table = lancedb.connect(job["db"]).open_table(TABLE)
    ds = StreamingDataset(
        table, columns=["tokens"], num_splits=NUM_SPLITS, shuffle_seed=1, rank=0, world_size=1,
        pack_sequences=job["seq_len"], eos_id=EOS,
    )  # fmt: skip
    assert ds.packing is not None
    out = {}
    for epoch in range(epochs):
        blocks = ds.packing.epoch(epoch)
        total = int(ds.packing.lengths.sum()) + ds.num_rows  # every document and its eos
        in_blocks = blocks.blocks_per_split * NUM_SPLITS * job["seq_len"]
        assert in_blocks + blocks.tokens_dropped == total
        out[epoch] = {"tokens": total, "in_blocks": in_blocks, "dropped": blocks.tokens_dropped}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="the shortened run CI checks")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    files, doc_bytes = (24, 600) if args.quick else (120, 2000)
    started = time.perf_counter()
    # ranks fork from a server that imported torch and the loader once (not run: fork-safe)
    mp.set_forkserver_preload(["torch", "loader.read.packed_reader"])
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tokens = build_table(out / "db", files, doc_bytes)
    base = {
        "db": str(out / "db"), "seq_len": args.seq_len, "global_batch": args.global_batch,
        "epochs": args.epochs, "checkpoints": str(out / "ckpt"),
    }  # fmt: skip
    Path(base["checkpoints"]).mkdir(exist_ok=True)
    whole = {**base, "log": str(out / "uninterrupted")}
    assert launch(4, whole), "the uninterrupted run failed"
    reference = read_logs(out / "uninterrupted")
    total_steps = len(reference)
    crash_at = total_steps * 6 // 10  # in epoch 1 of 2 by default
    every = max(2, total_steps // 7)
    crashed = {**base, "log": str(out / "crashed"), "checkpoint_every": every}
    crashed |= {"crash_at_step": crash_at, "crash_rank": 1}
    assert not launch(4, crashed), "the crashing run was expected to crash"
    resumed_from = crash_at // every * every
    assert launch(2, {**base, "log": str(out / "resumed"), "resume": True}), "the resume failed"
    before = {s: r for s, r in read_logs(out / "crashed").items() if s <= resumed_from}
    after = read_logs(out / "resumed")
    combined = before | after
    assert sorted(combined) == sorted(reference), "the resumed run has other steps"
    diffs = [abs(combined[s][0]["loss"] - reference[s][0]["loss"]) for s in sorted(reference)]
    seen, want = blocks_per_epoch(combined), blocks_per_epoch(reference)
    summary = {
        "documents": files,
        "tokens_in_table": tokens,
        "seq_len": args.seq_len,
        "global_batch": args.global_batch,
        "steps": total_steps,
        "crash": {"world_size": 4, "rank": 1, "after_step": crash_at, "checkpoint_step": resumed_from},
        "resume_world_size": 2,
        "max_abs_loss_difference": max(diffs),
        "first_losses": [round(reference[s][0]["loss"], 6) for s in sorted(reference)[:3]],
        "last_loss": reference[total_steps][0]["loss"],
        "blocks_per_epoch": {e: sum(c.values()) for e, c in want.items()},
        "every_block_once_per_epoch": seen == want,
        "tokens_per_epoch": token_accounting(base, args.epochs),
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
