"""Loopback helpers shared by the tests: a free port, polling with a deadline, a JSON GET."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(probe: Callable[[], T | None], deadline_s: float, what: str) -> T:
    """Call `probe` until it returns something other than None/False, or fail after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > end:
            raise TimeoutError(f"gave up after {deadline_s} s waiting for {what}")
        threading.Event().wait(0.05)  # the polling interval


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 right now (no proxies: everything here is loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1) as response:
            return int(response.status) == 200
    except OSError:
        return False


_RAISE: Any = object()


def get_json(url: str, timeout_s: float = 5.0, *, otherwise: Any = _RAISE) -> Any:
    """GET `url` and parse its JSON (no proxies). An HTTP error or an unreachable server
    raises, or returns `otherwise` when one is given (for polling until it answers)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            return orjson.loads(response.read())
    except OSError:
        if otherwise is _RAISE:
            raise
        return otherwise
