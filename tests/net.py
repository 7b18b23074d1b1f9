"""Loopback helpers shared by the tests: a free port, polling with a deadline, GETs, and a
small HTTP server on a thread."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
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


# A GET's socket timeout: generous, because a loaded 2-core CI machine can hold a loopback
# answer for seconds; the behaviour under test is never how fast the collector answers.
GET_TIMEOUT_S = 30.0


def get_bytes(url: str, timeout_s: float = GET_TIMEOUT_S) -> bytes:
    """GET `url` (no proxies: everything here is loopback); an HTTP error raises."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout_s) as response:
        return bytes(response.read())


def get_json(url: str, timeout_s: float = GET_TIMEOUT_S, *, otherwise: Any = _RAISE) -> Any:
    """GET `url` and parse its JSON. An HTTP error or an unreachable server raises, or
    returns `otherwise` when one is given (for polling until it answers)."""
    try:
        return orjson.loads(get_bytes(url, timeout_s))
    except OSError:
        if otherwise is _RAISE:
            raise
        return otherwise


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], **state: Any) -> Iterator[Any]:
    """A threaded HTTP server on 127.0.0.1 with `handler`, `state` set on it as attributes
    (the handler reads them as `self.server.<name>`); shut down on exit."""
    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in state.items():
        setattr(server, name, value)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
