"""A call to a store, waited for at most a deadline.

A store that stops answering holds a request until its client's own timeouts, retries
included, give up, and those are not ours to bound. So the caller waits for the call in
another (daemon) thread for at most the time left and raises `Overdue` then; the call runs
on until the client gives up, abandoned. `on_overdue` lets a caller stop what the abandoned
call would still do (a write's last step). Standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")


class Overdue(TimeoutError):
    """A call that had not finished when its deadline came."""


def within(
    call: Callable[[], R],
    timeout_s: float,
    what: str,
    on_overdue: Callable[[], None] | None = None,
    name: str = "elastic-loader-store-call",
) -> R:
    """`call()` in a daemon thread named `name`, waited for at most `timeout_s` seconds;
    after that `Overdue` (its message: "no answer within `what`")."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # handed to the waiting thread below
            box["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(max(0.0, timeout_s)):
        if on_overdue is not None:
            on_overdue()
        raise Overdue(f"no answer within {what}")
    if "error" in box:
        raise box["error"]
    return box["value"]
