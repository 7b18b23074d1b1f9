"""DataLoader workers, and the forkserver that starts them, outlive a SIGTERM to the job.

SLURM and Kubernetes preempt a job by sending SIGTERM to every process, DataLoader workers
included, then SIGKILL after a grace period. A worker that dies of it makes torch raise in
the main process ("DataLoader worker ... exited unexpectedly"), possibly before the
emergency checkpoint its SIGTERM handler asked for is written. So a worker takes SIGTERM
as "leave within GRACE_S": the main process decides when to stop, and a worker still
leaves at once when its loader shuts it down or its main process is gone (`leave_with`).
The grace bounds how long a worker that torch's own shutdown terminates (one stuck in a
read) can linger.
"""

from __future__ import annotations

import os
import select
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
    """In the forkserver: it leaves once the main process and every worker are gone (each
    holds its pipe)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def leave_with(main_pid: int) -> None:
    """In a worker: exit as soon as the main process `main_pid` is gone.

    torch's workers watch their parent, which under forkserver is the forkserver, and the
    forkserver stays up while a worker holds its pipe: a main process killed by SIGKILL (an
    OOM kill, a launcher's last resort) left its workers running for good."""
    threading.Thread(
        target=_exit_when_gone, args=(main_pid,), daemon=True, name="loader-main-watch"
    ).start()


def _leave_after_sigterm() -> None:
    signal.sigwait({signal.SIGTERM})
    time.sleep(GRACE_S)
    os._exit(128 + signal.SIGTERM)


def _exit_when_gone(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)  # readable once the process has ended
    except ProcessLookupError:
        os._exit(0)
    except OSError:  # no pidfd (an old kernel, a sandbox): ask every second
        while _alive(pid):
            time.sleep(1.0)
    else:
        select.select([handle], [], [])
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's
        pass
    return True
