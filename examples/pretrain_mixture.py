"""Pretrain a tiny LM on a mixture of three corpora; anneal the weights mid-run; crash on 4
ranks, resume on 2: the same loss curve, step for step.

The corpora ship with Python (nothing is downloaded), byte-level tokens as in
examples/pretrain_lm.py, one LanceDB table each, packed into blocks of ``--seq-len``:

- ``code``: the standard library's top-level modules;
- ``docs``: the docstrings of those modules (``ast``);
- ``packages``: the modules of its packages (email, json, http, ...).

The mixture is ``{code: 6, docs: 3, packages: 1}`` until ``--anneal-at`` (a fraction of the
run), then ``{code: 2, docs: 5, packages: 3}``: at that step the job saves the loader's state,
builds the mixture with the new weights and loads the state (the annealing recipe: each
corpus goes on from its cursors, new shares from that step on). Three runs with real
processes (Gloo on CPU, float64):

1. uninterrupted on W = 4;
2. W = 4 with a checkpoint every few steps, rank 1 SIGKILLs itself after the anneal;
3. a resume of the last checkpoint on W = 2 (built with the new weights).

It checks that run 2 up to its checkpoint then run 3 give run 1's loss at every step (to
1e-9) and the same blocks, and that every step holds the blocks of each corpus its weights
say. It logs each rank's loss per corpus (from the batch's ``source`` field).

    python examples/pretrain_mixture.py --out /tmp/mixture          # ~1 min on 2 cores
    python examples/pretrain_mixture.py --out /tmp/mixture --quick  # what CI runs
"""

from __future__ import annotations

import argparse
import ast
import json
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pretrain_lm import (
    EOS,
    VOCAB,
    TinyLM,
    all_reduce_grads,
    block_hash,
    checkpoint_or_crash,
    launch,
    read_logs,
)

from loader import MixedDataset, StreamingDataLoader, StreamingDataset
from loader.checkpoint import load
from loader.read.packed_reader import IGNORE_INDEX

NAMES = ("code", "docs", "packages")
BEFORE, AFTER = (6, 3, 1), (2, 5, 3)  # the weights, and the annealing ones
NUM_SPLITS = (4, 2, 3)  # each corpus its own plan


def corpora(max_files: int, max_doc_bytes: int) -> dict[str, list[bytes]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = sorted(stdlib.glob("*.py"))[:max_files]
    packages = sorted(p for p in stdlib.glob("*/*.py") if "test" not in p.parts[-2])[:max_files]
    docs = []
    for path in modules:
        tree = ast.parse(path.read_bytes())
        text = "\n\n".join(
            ast.get_docstring(node) or ""
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        )
        docs.append(text.encode())
    return {
        "code": [p.read_bytes()[:max_doc_bytes] for p in modules],
        "docs": [d[:max_doc_bytes] for d in docs if d],
        "packages": [p.read_bytes()[:max_doc_bytes] for p in packages],
    }


def build_tables(db: Path, max_files: int, max_doc_bytes: int) -> dict[str, int]:
    conn = lancedb.connect(str(db))
    tokens = {}
    for name, docs in corpora(max_files, max_doc_bytes).items():
        arrays = [np.frombuffer(d, dtype=np.uint8).astype(np.int16) for d in docs]
        table = pa.table({"tokens": pa.array(arrays, pa.list_(pa.int16()))})
        conn.create_table(name, table, mode="overwrite")
        tokens[name] = sum(len(a) for a in arrays)
    return tokens


def make_loader(job: dict[str, Any], weights: tuple[int, ...]) -> StreamingDataLoader:
    conn = lancedb.connect(job["db"])
    datasets = {}
    for k, (name, splits) in enumerate(zip(NAMES, NUM_SPLITS, strict=True)):
        datasets[name] = StreamingDataset(
            conn.open_table(name), columns=["tokens"], num_splits=splits, shuffle_seed=k,
            pack_sequences=job["seq_len"], eos_id=EOS,
        )  # fmt: skip
    mixture = MixedDataset(datasets, list(weights), epoch_source="code")
    return StreamingDataLoader(
        mixture, global_batch_size=job["global_batch"], total_steps=job["steps"]
    )  # the dashboard's "step x of N" and job ETA


def run_rank(rank: int, world: int, port: int, job: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        train(rank, job)
    finally:
        dist.destroy_process_group()


def train(rank: int, job: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = TinyLM(job["seq_len"]).double()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ckpt = Path(job["checkpoints"])
    step = 0
    if job.get("resume"):
        saved = torch.load(ckpt / "model.pt")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        step = saved["step"]
    dl = make_loader(job, AFTER if step >= job["anneal_at"] else BEFORE)
    if job.get("resume"):
        dl.load_state_dict(load(ckpt / "loader.ckpt"))
    log = (Path(job["log"]) / f"rank{rank}.jsonl").open("a")
    while step < job["steps"]:
        for batch in dl:
            logits = model(batch)
            labels = batch["labels"]
            per_token = F.cross_entropy(
                logits.view(-1, VOCAB), labels.view(-1), ignore_index=IGNORE_INDEX, reduction="none"
            ).view(labels.shape)
            loss = per_token.sum()
            opt.zero_grad()
            loss.backward()
            totals = all_reduce_grads(model, loss.item(), float((labels != IGNORE_INDEX).sum()))
            opt.step()
            step += 1
            sources = batch["source"].tolist()
            record = {
                "step": step,
                "loss": float(totals[0] / totals[1]),
                "blocks": [
                    [s, block_hash(row)] for s, row in zip(sources, batch["input_ids"], strict=True)
                ],
                "passes": dl.streaming_dataset.facts()["passes"],
                "rank_loss_by_source": {  # this rank's own, for a per-corpus curve
                    NAMES[s]: float(per_token[batch["source"] == s].sum()) for s in set(sources)
                },
            }
            log.write(json.dumps(record) + "\n")
            log.flush()
            checkpoint_or_crash(job, rank, step, model, opt, dl, log)
            if step == job["anneal_at"]:  # new weights from the next step on
                state = dl.state_dict()
                dl = make_loader(job, AFTER)
                dl.load_state_dict(state)
                break
            if step == job["steps"]:
                break
    log.close()


def check_counts(steps: dict[int, list[dict[str, Any]]], job: dict[str, Any]) -> dict[str, int]:
    """Every step holds the blocks of each corpus its weights say (within one block)."""
    totals: Counter[int] = Counter()
    for step in sorted(steps):
        count = Counter(s for r in steps[step] for s, _ in r["blocks"])
        weights = AFTER if step > job["anneal_at"] else BEFORE
        for s, w in enumerate(weights):
            assert abs(count[s] - job["global_batch"] * w / sum(weights)) < 1, (step, count)
        totals.update(count)
    return {NAMES[s]: totals[s] for s in range(len(NAMES))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quick", action="store_true", help="the shortened run CI checks")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=10)
    p.add_argument("--steps", type=int, default=None)
    args = p.parse_args(argv)
    files, doc_bytes, steps = (16, 500, 24) if args.quick else (80, 2000, 120)
    steps = args.steps or steps
    started = time.perf_counter()
    mp.set_forkserver_preload(["torch", "loader.read.packed_reader"])
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tokens = build_tables(out / "db", files, doc_bytes)
    base = {
        "db": str(out / "db"), "seq_len": args.seq_len, "global_batch": args.global_batch,
        "steps": steps, "anneal_at": steps // 3, "checkpoints": str(out / "ckpt"),
    }  # fmt: skip
    Path(base["checkpoints"]).mkdir(exist_ok=True)
    assert launch(4, {**base, "log": str(out / "uninterrupted")}, run_rank), (
        "the uninterrupted run failed"
    )
    reference = read_logs(out / "uninterrupted")
    crash_at = steps * 7 // 10 + 1  # after the anneal, a step past a checkpoint
    every = max(2, steps // 6)
    crashed = {**base, "log": str(out / "crashed"), "checkpoint_every": every}
    crashed |= {"crash_at_step": crash_at, "crash_rank": 1}
    assert not launch(4, crashed, run_rank), "the crashing run was expected to crash"
    resumed_from = crash_at // every * every
    assert resumed_from > base["anneal_at"], "the checkpoint should hold the annealed weights"
    assert launch(2, {**base, "log": str(out / "resumed"), "resume": True}, run_rank), (
        "the resume failed"
    )
    before = {s: r for s, r in read_logs(out / "crashed").items() if s <= resumed_from}
    combined = before | read_logs(out / "resumed")
    assert sorted(combined) == sorted(reference), "the resumed run has other steps"
    diffs = [abs(combined[s][0]["loss"] - reference[s][0]["loss"]) for s in sorted(reference)]
    blocks = check_counts(reference, base)
    same_blocks = all(
        sorted(b[1] for r in combined[s] for b in r["blocks"])
        == sorted(b[1] for r in reference[s] for b in r["blocks"])
        for s in reference
    )
    summary = {
        "tokens_in_tables": tokens,
        "weights": {"before": dict(zip(NAMES, BEFORE, strict=True)), "after": dict(zip(NAMES, AFTER, strict=True))},
        "anneal_at_step": base["anneal_at"],
        "steps": steps,
        "global_batch": args.global_batch,
        "blocks_per_corpus": blocks,
        "passes_at_end": reference[steps][0]["passes"],
        "crash": {"world_size": 4, "rank": 1, "after_step": crash_at, "checkpoint_step": resumed_from},
        "resume_world_size": 2,
        "max_abs_loss_difference": max(diffs),
        "same_blocks_every_step": same_blocks,
        "first_loss": reference[1][0]["loss"],
        "last_loss": reference[steps][0]["loss"],
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
