"""A rank that waits on its DataLoader workers longer than a limit fails loudly.

torch's `timeout=` bounds the queue wait only. A worker stopped (SIGSTOP, a debugger, a
frozen container) after it queued a batch leaves the main thread waiting forever in the
file-descriptor handshake with that worker, and a stopped worker counts as alive, so
torch's status checks never fire. The job then burns GPU-hours doing nothing.

The watchdog is a thread beside the training loop. The loader marks when it starts
waiting for data and when the data arrives; past the limit the watchdog notes which
workers are stopped (from /proc), kills the workers (SIGKILL reaches a stopped process)
so the blocked call returns, and the loader raises `DataWaitTimeout` naming them. The
rank fails and the job restarts from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DEFAULT_DATA_TIMEOUT_S = 600.0

_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible I/O",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "a zombie",
    "X": "dead",
    "I": "idle",
}


class DataWaitTimeout(RuntimeError):
    """The rank waited longer than `data_timeout_s` for a batch from its workers."""


def process_state(pid: int) -> str:
    """A word for the state of process `pid` (Linux /proc; 'unknown' elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "unknown"
    letter = stat.rsplit(")", 1)[-1].split()[0]  # the name in (...) may hold spaces
    return _STATES.get(letter, letter)


class Watchdog:
    """Watches one iteration's waits for data; `check` raises once it has fired."""

    def __init__(self, limit_s: float, workers: Callable[[], list[int]], rank: int) -> None:
        self.limit_s = limit_s
        self._workers = workers
        self._rank = rank
        self._since: float | None = None
        self._fired: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="elastic-loader-data-watchdog", daemon=True
        )
        self._thread.start()

    def waiting(self) -> None:
        self._since = time.monotonic()

    def received(self) -> None:
        self._since = None

    def check(self, cause: BaseException | None = None) -> None:
        """Raise DataWaitTimeout (from `cause`, the error the killed workers caused) if fired."""
        if self._fired is not None:
            raise DataWaitTimeout(self._fired) from cause

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        poll = min(1.0, self.limit_s / 10)
        while not self._stop.wait(poll):
            since = self._since
            if since is not None and time.monotonic() - since > self.limit_s:
                self._fire(time.monotonic() - since)
                return

    def _fire(self, waited: float) -> None:
        pids = self._workers()
        states = {pid: process_state(pid) for pid in pids}
        stuck = [pid for pid, state in states.items() if state.startswith("stopped")]
        listed = ", ".join(f"pid {pid} ({state})" for pid, state in states.items()) or "none"
        blame = (
            f"worker pid(s) {', '.join(map(str, stuck))} stopped (SIGSTOP or a debugger?)"
            if stuck
            else "no worker delivered it"
        )
        self._fired = (
            f"rank {self._rank} waited {waited:.1f} s for a batch, more than "
            f"data_timeout_s={self.limit_s:g}: {blame}. Workers: {listed}. They were killed so "
            f"this rank fails and the job can restart from its last checkpoint; raise "
            f"data_timeout_s if batches legitimately take this long"
        )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class WorkerPids:
    """The pids of a torch iterator's workers, without keeping the iterator alive."""

    def __init__(self, reads: Any) -> None:
        self._reads = weakref.ref(reads)

    def pids(self) -> list[int]:
        workers = getattr(self._reads(), "_workers", None) or []
        return [w.pid for w in workers if w.pid is not None]


def watched_batches(
    reads: Iterator[list[Any]], limit_s: float | None, workers: WorkerPids, rank: int
) -> Iterator[Any]:
    """The batches of each read from torch's iterator; with a limit, every wait is watched."""
    if limit_s is None:
        yield from (batch for read in reads for batch in read)
        return
    watchdog = Watchdog(limit_s, workers.pids, rank)
    try:
        while True:
            watchdog.waiting()
            try:
                read = next(reads)
            except StopIteration:
                return
            except Exception as err:
                watchdog.check(err)
                raise
            watchdog.received()
            watchdog.check()
            yield from read
    finally:
        watchdog.close()
