"""How a process's telemetry clients end: one shared deadline, and the reason they close.

A process stopped by SIGTERM (a launcher ending the job after another process died, a
preemption, an elastic agent restarting its workers) says so as it goes: a handler chained
in front of the previous one sends `closed` with reason `terminated`, the signal's name and,
under a torchrun agent with restarts left, `restart: true`; then the previous handler runs
(by default the process dies of the signal, as it would have). So the dashboard names the
process that died first, not the ones terminated after it.

At its end a process flushes every client at once under one `EXIT_BUDGET_S` deadline, from
atexit in a script or torchrun rank and from a multiprocessing finalizer in a spawned or
forked child (which leaves through `os._exit` and skips atexit). The `closed` event then
says why: `exit`, or `error` with the exception's type when the process is ending on an
uncaught exception, which `sys.excepthook` (chained, never replaced) reports before atexit
runs, and which is still in flight while a multiprocessing child runs its finalizers.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Protocol

from loader.wire import (
    CLOSE_REASON_CLOSE,
    CLOSE_REASON_ERROR,
    CLOSE_REASON_EXIT,
    CLOSE_REASON_TERMINATED,
)


class Exiting(Protocol):
    """What this module needs of a telemetry client (`loader.telemetry.client` is the one):
    the process and thread that made it, its sender thread, and how to ask for its last send.
    A Protocol, so this lower room never imports the client that registers here."""

    _pid: int
    _owner: threading.Thread
    _thread: threading.Thread
    _stop: threading.Event

    def _finish(
        self,
        reason: str = ...,
        error: str | None = None,
        deadline: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None: ...


# At a process's end, all clients together wait at most this long for their last send.
EXIT_BUDGET_S = 2.0
_LIVE: weakref.WeakSet[Exiting] = weakref.WeakSet()
_DEADLINE: dict[int, float] = {}  # pid → when this process's exit stops waiting


@atexit.register
def _close_all(budget_s: float = EXIT_BUDGET_S, signum: int | None = None) -> None:
    """Flush every open client of this process at its end: atexit in a script or torchrun
    rank, the multiprocessing finalizer in a spawned / forked child (which skips atexit).

    All senders are told at once and share one deadline, so exit waits `budget_s` at most
    however many clients there are and however dead the collector is. Clients already
    closing (a loader collected as the child's target returned) are waited for too: their
    last send would otherwise race the child's `os._exit`.
    """
    reason, error = _exit_reason()
    extra = None
    if signum is not None:
        reason, error, extra = CLOSE_REASON_TERMINATED, None, _signal_facts(signum)
    clients = [c for c in list(_LIVE) if c._pid == os.getpid()]
    # atexit and multiprocessing's own atexit hook both call this: one deadline for both
    deadline = _DEADLINE.setdefault(os.getpid(), time.monotonic() + budget_s)
    _finish_together(clients, reason, error, deadline, extra)


def close_together(clients: list[Exiting], budget_s: float = EXIT_BUDGET_S) -> None:
    """Close `clients` at once under one deadline: `budget_s` at most for all of them, where
    closing them one after the other waits up to `budget_s` each on a collector that never
    answers."""
    live = [c for c in clients if not c._stop.is_set()]
    _finish_together(live, CLOSE_REASON_CLOSE, None, time.monotonic() + budget_s)


def _finish_together(
    clients: list[Exiting],
    reason: str,
    error: str | None,
    deadline: float,
    extra: dict[str, Any] | None = None,
) -> None:
    for client in clients:  # every sender is told first, so their last sends overlap
        client._finish(reason, error, deadline, extra)
    for client in clients:
        client._thread.join(max(0.0, deadline - time.monotonic()))


_UNCAUGHT: list[str] = []  # type names of uncaught exceptions seen by the hooks below
_HOOKED_PID: list[int] = []


def _exit_reason() -> tuple[str, str | None]:
    """`error` and the exception's type when the process ends on one, else `exit`.

    A script's uncaught exception reaches `sys.excepthook` before atexit runs; in a
    multiprocessing child the exception (or torch.multiprocessing's `sys.exit(1)`) is still
    in flight while the finalizers run, so `sys.exc_info()` shows it.
    """
    exc = sys.exc_info()[1]
    if isinstance(exc, SystemExit) and exc.code not in (0, None):
        return CLOSE_REASON_ERROR, f"SystemExit({exc.code!r})"[:200]
    if exc is not None and not isinstance(exc, SystemExit):
        return CLOSE_REASON_ERROR, type(exc).__qualname__
    if _UNCAUGHT:
        return CLOSE_REASON_ERROR, _UNCAUGHT[-1]
    return CLOSE_REASON_EXIT, None


def install_exit_hooks() -> None:
    """Chain `sys.excepthook` and `threading.excepthook` once (an uncaught exception in the
    main thread ends the process; in another thread, the clients that thread made), and
    register the multiprocessing finalizer once per process."""
    if not _HOOKED_PID:
        previous, previous_thread = sys.excepthook, threading.excepthook

        def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            _UNCAUGHT.append(kind.__qualname__)
            previous(kind, exc, tb)

        def thread_excepthook(args: Any) -> None:
            # a thread's error ends no process, but it ends the loaders that thread built
            for client in [c for c in list(_LIVE) if c._owner is args.thread]:
                client._finish(CLOSE_REASON_ERROR, args.exc_type.__qualname__)
            previous_thread(args)

        sys.excepthook, threading.excepthook = excepthook, thread_excepthook
    if os.getpid() not in _HOOKED_PID:  # a forked child starts with an empty registry
        _HOOKED_PID.append(os.getpid())
        multiprocessing.util.Finalize(None, _close_all, exitpriority=100)
    _chain_signal(signal.SIGTERM)  # once per process (a no-op off the main thread: again later)


_PREVIOUS: dict[int, Any] = {}  # signal → the handler ours runs after


def _signal_facts(signum: int) -> dict[str, Any]:
    """The signal's name and, under a torchrun agent with restarts left, `restart: True`
    (the agent stops its workers this way before it starts them again)."""
    facts: dict[str, Any] = {"signal": signal.Signals(signum).name}
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    most = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "")
    if count.isdigit() and most.isdigit() and int(count) < int(most):
        facts["restart"] = True
    return facts


def _on_signal(signum: int, frame: Any) -> None:
    """Send every client's `closed` (reason `terminated`), then do what the process would
    have done without us: the previous handler, or die of the signal."""
    _close_all(signum=signum)
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _chain_signal(signum: int) -> None:
    """Put `_on_signal` in front of `signum`'s handler, once, from the main thread only (the
    only one Python lets set handlers); a process that ignores the signal keeps ignoring it."""
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signum)
    if current is _on_signal or current == signal.SIG_IGN or current is None:
        return
    _PREVIOUS[signum] = current
    signal.signal(signum, _on_signal)
