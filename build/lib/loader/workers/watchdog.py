"""A rank that waits on its DataLoader workers longer than a limit fails loudly.

torch's `timeout=` bounds the queue wait only. A worker stopped (SIGSTOP, a debugger, a
frozen container) after it queued a batch leaves the main thread waiting forever in the
file-descriptor handshake with that worker, and a stopped worker counts as alive, so
torch's status checks never fire. The job then burns GPU-hours doing nothing.

The watchdog is a thread beside the training loop. The loader marks when it starts
waiting for data and when the data arrives; past the limit (`data_timeout_s`, or torch's
`timeout=` when that is smaller) the watchdog notes which workers are stopped (from /proc),
writes the Python stacks of the main process and every worker to a file
(`loader.workers.stacks`), kills the workers (SIGKILL reaches a stopped process) so the blocked
call returns, and the loader raises `DataWaitTimeout` naming them and the file. The rank
fails and the job restarts from its last checkpoint.
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
from typing import Any, NamedTuple

from loader.workers.stacks import StackDumps

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
    """The rank waited longer than `data_timeout_s` (or torch's smaller `timeout=`) for a
    batch from its workers."""


class WaitLimit(NamedTuple):
    seconds: float
    name: str  # the argument that set it: "data_timeout_s", or torch's "timeout"

    @property
    def said(self) -> str:
        torch = "torch's " if self.name == "timeout" else ""
        return f"{torch}{self.name}={self.seconds:g}"


def wait_limit(data_timeout_s: float | None, torch_timeout: float) -> WaitLimit | None:
    """The smaller of `data_timeout_s` and torch's `timeout=` (0: none), or None for none.

    torch's own timeout bounds only its queue wait, not a stopped worker's handshake; a user
    who set it expects it to bound the wait, so the watchdog applies it too.
    """
    limits = []
    if data_timeout_s is not None:
        limits.append(WaitLimit(data_timeout_s, "data_timeout_s"))
    if torch_timeout > 0:
        limits.append(WaitLimit(float(torch_timeout), "timeout"))
    return min(limits, key=lambda limit: limit.seconds) if limits else None


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

    def __init__(
        self,
        limit: WaitLimit,
        workers: Callable[[], list[int]],
        rank: int,
        stacks: StackDumps | None = None,
    ) -> None:
        self.limit_s = limit.seconds
        self._limit = limit
        self._workers = workers
        self._rank = rank
        self._stacks = stacks
        self._since: float | None = None
        self._fired: str | None = None
        self._firing = threading.Lock()
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
        """Raise DataWaitTimeout (from `cause`, the error the killed workers caused) if fired.

        An error that comes once the limit has passed (torch's own `timeout=`, when it is
        the limit) fires it here first, so it too says where the workers were stuck.
        """
        since = self._since
        if cause is not None and since is not None and time.monotonic() - since >= self.limit_s:
            self._fire(time.monotonic() - since)
        with self._firing:  # a firing under way (a stopped worker, continued to write its
            fired = self._fired  # stacks, may deliver meanwhile) ends before the loop goes on
        if fired is not None:
            raise DataWaitTimeout(fired) from cause

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
        with self._firing:  # once: the watchdog's thread and `check` may both get here
            if self._fired is None:
                self._fire_once(waited)

    def _fire_once(self, waited: float) -> None:
        pids = self._workers()
        states = {pid: process_state(pid) for pid in pids}
        stuck = [pid for pid, state in states.items() if state.startswith("stopped")]
        listed = ", ".join(f"pid {pid} ({state})" for pid, state in states.items()) or "none"
        blame = (
            f"worker pid(s) {', '.join(map(str, stuck))} stopped (SIGSTOP or a debugger?)"
            if stuck
            else "no worker delivered it"
        )
        report = self._stacks.dump(self._rank, states) if self._stacks is not None else None
        where = (
            f"The Python stacks of the main process and every worker are in {report}. "
            if report is not None
            else ""
        )
        self._fired = (
            f"rank {self._rank} waited {waited:.1f} s for a batch, more than "
            f"{self._limit.said}: {blame}. Workers: {listed}. {where}They were killed so this "
            f"rank fails and the job can restart from its last checkpoint; raise "
            f"{self._limit.name} if batches legitimately take this long"
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
    reads: Iterator[list[Any]],
    limit: WaitLimit | None,
    workers: WorkerPids,
    rank: int,
    stacks: StackDumps | None = None,
) -> Iterator[Any]:
    """The batches of each read from torch's iterator; with a limit, every wait is watched."""
    if limit is None:
        yield from (batch for read in reads for batch in read)
        return
    watchdog = Watchdog(limit, workers.pids, rank, stacks)
    try:
        while True:
            watchdog.waiting()
            try:
                read = next(reads)
            except StopIteration:
                watchdog.check()  # fired meanwhile (its workers are killed): the rank fails
                return
            except Exception as err:
                watchdog.check(err)
                raise
            watchdog.received()
            watchdog.check()
            yield from read
    finally:
        watchdog.close()
