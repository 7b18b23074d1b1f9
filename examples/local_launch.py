"""Start the ranks of a job on this machine, without torchrun.

``torchrun`` starts a fresh interpreter per rank, and each one imports torch: 2-6 s on a
busy laptop, paid again by every run. The main job runs eleven jobs in a row, so this
launcher forks ranks from a forkserver that has imported torch once; the forkserver
outlives each job, and every later job of the same driver starts as fast. Ranks meet
through a FileStore in a fresh temporary folder (no port to pick, none to collide) and
Gloo talks over loopback only. On several machines, use torchrun (``docs/multinode.md``).
``main_job.py``, ``train_ddp.py --nproc N`` and the other examples start ranks with it; run
this file to see 2 ranks meet and all-reduce:

    python examples/local_launch.py
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing

# torch's own modules only: DDP's first use imports torch._dynamo (~1 s per rank).
# Not lancedb or pyarrow, which start threads that a fork must not copy.
PRELOAD = ["torch", "torch._dynamo", "torch.nn.parallel"]


def launch(target: Callable[..., None], job: Any, world_size: int) -> None:
    """Run ``target(rank, world_size, job, store_path)`` on ``world_size`` ranks and wait.

    Raises:
        torch.multiprocessing.ProcessExitedException: a rank died (a signal names it,
            e.g. SIGKILL); the other ranks are terminated.
        torch.multiprocessing.ProcessRaisedException: a rank raised; its traceback included.
    """
    multiprocessing.set_forkserver_preload(PRELOAD)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
    # Ranks share the cores (W=4 on 2 cores): spinning OpenMP threads then steal the CPU
    # from each other; measured here, a 2-thread step ran 3-8x slower than with passive waits.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with tempfile.TemporaryDirectory(prefix="elastic-loader-store-") as folder:
        store = str(Path(folder) / "store")
        torch.multiprocessing.start_processes(
            target, args=(world_size, job, store), nprocs=world_size, start_method="forkserver"
        )


def demo_rank(rank: int, world_size: int, job: Any, store_path: str) -> None:
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size
    )
    try:
        total = torch.tensor(rank)
        dist.all_reduce(total)
        if rank == 0:
            print(f"{world_size} ranks met; all_reduce of their ranks: {int(total)}", flush=True)
    finally:
        dist.destroy_process_group()


def main() -> None:
    print(__doc__.split("\n\n")[0])
    launch(demo_rank, None, 2)


if __name__ == "__main__":
    main()
