"""DataLoader workers, and the forkserver that starts them, outlive a SIGTERM to the job.

SLURM and Kubernetes preempt a job by sending SIGTERM to every process, DataLoader workers
included, then SIGKILL after a grace period. A worker that dies of it makes torch raise in
the main process ("DataLoader worker ... exited unexpectedly"), possibly before the
emergency checkpoint its SIGTERM handler asked for is written. So a worker takes SIGTERM
as "leave within GRACE_S": the main process decides when to stop, and a worker still
leaves at once when its loader shuts it down or its main process is gone (torch's workers
watch their parent). The grace bounds how long a worker that torch's own shutdown
terminates (one stuck in a read) can linger.
"""

from __future__ import annotations

import os
import signal
import threading
import time

GRACE_S = 120.0  # past any scheduler's grace period (SLURM and Kubernetes: 30 s by default)


def outlive_sigterm() -> None:
    """In a worker: SIGTERM ends it GRACE_S later. The signal is blocked and taken by a
    thread of its own, so it is seen even while the worker is stuck in C code."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver passes SIG_IGN on
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads made later inherit it
    threading.Thread(target=_leave_after_sigterm, daemon=True, name="loader-sigterm").start()


def ignore_sigterm() -> None:
    """In the forkserver: it leaves when the main process does (it watches its parent)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _leave_after_sigterm() -> None:
    signal.sigwait({signal.SIGTERM})
    time.sleep(GRACE_S)
    os._exit(128 + signal.SIGTERM)
