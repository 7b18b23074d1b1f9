"""DataLoader workers, and the forkserver that starts them, outlive a SIGTERM to the job.

SLURM and Kubernetes preempt a job by sending SIGTERM to every process, DataLoader workers
included, then SIGKILL after a grace period. A worker that dies of it makes torch raise in
the main process ("DataLoader worker ... exited unexpectedly"), possibly in the middle of
the emergency checkpoint its SIGTERM handler is writing. So workers ignore SIGTERM: the
main process decides when to stop, and a worker still leaves when its loader shuts it
down or its main process is gone (torch's workers watch their parent).
"""

from __future__ import annotations

import signal


def outlive_sigterm() -> None:
    """In a worker: SIGTERM is the main process's to handle."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
