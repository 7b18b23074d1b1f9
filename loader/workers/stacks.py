"""Where a rank that timed out on data is stuck: the Python stacks of its processes, in a file.

A `DataWaitTimeout` that names pids only leaves the user guessing (a transform waiting on a
lock? a read that never returns?). So each worker registers `faulthandler` on `DUMP_SIGNAL`
when it starts, writing into its own file of a folder the loader chose; when the watchdog
fires it signals every worker (a stopped one is continued so it can answer), dumps the main
process's threads itself, and gathers everything into one `stacks.txt` that the error names.
faulthandler writes from its C signal handler, so a worker blocked in a lock or a C call
still answers; one that does not (in uninterruptible I/O, held by a debugger) is said so.
The folder is removed with its loader unless it holds a dump.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from loader.workers.preemption import leave_with, outlive_sigterm

DUMP_SIGNAL = signal.SIGUSR2
ANSWER_S = 3.0  # how long a signalled worker gets to write its stacks
REPORT = "stacks.txt"

_dump_files: list[IO[str]] = []  # a worker's open dump file (faulthandler keeps only its fd)


def _worker_file(folder: Path, pid: int) -> Path:
    return folder / f"worker-{pid}.txt"


class WorkerStacks:
    """The worker side (picklable: it is the loader's `worker_init_fn`), then the user's."""

    def __init__(self, folder: Path, user_init: Callable[[int], Any] | None) -> None:
        self.folder = folder
        self.user_init = user_init
        self.main_pid = os.getpid()  # a forked worker's main process: the one that built it

    def __getstate__(self) -> dict[str, Any]:
        # pickled by the process that starts the workers (forkserver, spawn): their main
        return {**self.__dict__, "main_pid": os.getpid()}

    def __call__(self, worker_id: int) -> None:
        outlive_sigterm()  # before anything can fail: see preemption.py
        leave_with(self.main_pid)
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # never fail a worker
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            out = open(_worker_file(self.folder, os.getpid()), "w", encoding="utf-8")  # noqa: SIM115
            _dump_files.append(out)
            faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
        if self.user_init is not None:
            self.user_init(worker_id)


class StackDumps:
    """The main-process side: one folder per loader, created by its first worker."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.gettempdir()) / f"elastic-loader-stacks-{uuid.uuid4().hex}"
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)

    def worker_init(self, user_init: Callable[[int], Any] | None) -> WorkerStacks:
        return WorkerStacks(self.folder, user_init)

    def dump(self, rank: int, states: Mapping[int, str]) -> Path | None:
        """Every worker's stacks and the main process's threads in one file (kept after the
        loader goes); None if it could not be written."""
        asked = {pid: _ask(pid, state) for pid, state in states.items()}
        deadline = time.monotonic() + ANSWER_S
        answers = {pid: _answer(_worker_file(self.folder, pid), deadline) if ok else None
                   for pid, ok in asked.items()}  # fmt: skip
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            report = self.folder / REPORT
            with open(report, "w", encoding="utf-8") as out:
                out.write(f"# rank {rank}, main process pid {os.getpid()}: every thread "
                          f"(the watchdog's is {threading.current_thread().name!r})\n")  # fmt: skip
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)
                for pid, text in answers.items():
                    out.write(f"\n# worker pid {pid} ({states[pid]})\n")
                    out.write(text or _silent(pid, states[pid]))
        except OSError:
            return None
        self._cleanup.detach()  # the user reads it after the rank fails
        return report


def _ask(pid: int, state: str) -> bool:
    """Signal `pid` to dump its stacks (continuing it if stopped, so that it can)."""
    try:
        os.kill(pid, DUMP_SIGNAL)
        if state.startswith("stopped"):
            os.kill(pid, signal.SIGCONT)
    except OSError:
        return False
    return True


def _answer(path: Path, deadline: float) -> str | None:
    """The dump a worker wrote to `path`, once it stops growing; None by the deadline."""
    seen = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8", errors="replace")
            if text and len(text) == seen:
                return text
            seen = len(text) if text else -1
        threading.Event().wait(0.05)
    return None


def _silent(pid: int, state: str) -> str:
    return (
        f"(no stacks: worker pid {pid}, {state}, did not answer {DUMP_SIGNAL.name} within "
        f"{ANSWER_S:g} s; a process in uninterruptible I/O or held by a debugger cannot; "
        f"`py-spy dump --pid {pid}` reads it from outside)\n"
    )
