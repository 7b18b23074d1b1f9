"""Failure drills for the training examples: a crash, a freeze, or a hold at a known step.

A test that kills a node or adds one needs the job to be at a known place when it does,
not wherever a timer happens to catch it. Each drill fires after a given global step:

- ``--crash-at-step K --crash-rank R``: rank R SIGKILLs itself (a process dies);
- ``--stall-at-step K``: rank R SIGSTOPs itself (a frozen node, killed whole by the test);
- ``--hold-at-step K:W``: every rank of a W-rank job waits at step K, all-reducing a token
  every 0.2 s, until the launcher changes the job: a node that dies breaks the collective
  (the survivors' agent restarts them on fewer ranks), and a node that joins makes the
  agent stop and restart them on more. A job of another size passes K without waiting.

They are flags of ``train_ddp.py`` (and of the jobs ``main_job.py`` starts); run this file
for a list and an example:

    python examples/drills.py
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

HOLD_LIMIT_S = 900.0  # a held job that nothing changes ends with an error, never hangs


def parse_hold(text: str) -> tuple[int, int]:
    """``K:W`` as (step, world size)."""
    step, sep, world = text.partition(":")
    if not sep or not step.isdigit() or not world.isdigit():
        raise ValueError(f"--hold-at-step takes STEP:WORLD_SIZE, e.g. 10:4; got {text!r}")
    return int(step), int(world)


def crash_if_asked(
    crash_rank: int, crash_at: int | None, stall_at: int | None, rank: int, step: int
) -> None:
    if crash_rank != rank or step not in (crash_at, stall_at):
        return
    how = "SIGKILL" if step == crash_at else "SIGSTOP"
    print(f"\n  rank {rank}: {how} after step {step}", file=sys.stderr)
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL if how == "SIGKILL" else signal.SIGSTOP)


def hold_if_asked(holds: tuple[tuple[int, int], ...], step: int, device: torch.device) -> None:
    world = dist.get_world_size()
    if (step, world) not in holds:
        return
    print(f"  rank {dist.get_rank()}: holding at step {step} (W={world})", flush=True)
    token = torch.zeros(1, device=device)
    deadline = time.monotonic() + HOLD_LIMIT_S
    while time.monotonic() < deadline:
        dist.all_reduce(token)  # raises once a peer is gone
        time.sleep(0.2)
    raise SystemExit(f"held at step {step} for {HOLD_LIMIT_S:.0f} s and nothing changed the job")


def main() -> None:
    print(__doc__.split("\n\nThey are flags")[0])
    print(
        "\nE.g. rank 1 of 2 dies after step 5 of a job checkpointed every 3 steps, then it resumes:"
    )
    print("    python examples/train_ddp.py --nproc 2 --epochs 1 --checkpoint-dir /tmp/drill \\")
    print("        --checkpoint-every 3 --crash-at-step 5 --crash-rank 1")
    print(
        "    python examples/train_ddp.py --nproc 2 --epochs 1 --checkpoint-dir /tmp/drill --resume"
    )


if __name__ == "__main__":
    main()
