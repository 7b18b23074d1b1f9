"""A fault-injecting TCP proxy on loopback: latency and dropped requests in front of a server.

The tests and the benchmarks put it between the Lance/pyarrow clients and the moto S3
server, so the read path meets what a real object store costs: a round trip per request,
and now and then a connection that dies. It knows just enough HTTP to find where a
request starts: clients keep connections alive and do not pipeline, so a request starts
with the first bytes the client sends after the server last answered. Each request waits
`delay_s` there, and every k-th request (or each one with a probability, from a seed) is
cut: the connection is reset after `cut_after_bytes` of its response (0: before any). With
`answer` set, the proxy answers every request itself with those bytes (an HTTP response:
`http_response` builds one, e.g. S3's 403 or a 500) and closes the connection.

It counts the bytes each request's answer brings back (`Counts.by_request`, by method and
path). A server that closes its connection after answering (moto does, every request)
ends the client's side with a FIN after the last byte; only an injected cut resets it (a
reset drops what the client has not read yet, and S3 clients fetch that range again).

One thread per direction per connection, at most `max_connections` at once (more are
refused); `close()` stops everything and joins the threads.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

_CHUNK = 1 << 16


@dataclass
class Faults:
    """What the proxy does to requests; change it on a running proxy with `proxy.faults = …`."""

    delay_s: float = 0.0
    drop_every: int = 0  # cut every k-th request (0: never)
    drop_probability: float = 0.0  # or cut each request with this probability
    seed: int = 0
    cut_after_bytes: int = 0  # response bytes forwarded before the cut
    answer: bytes = b""  # a whole HTTP response sent instead of forwarding (b"": forward)

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.drop_every < 0 or self.cut_after_bytes < 0:
            raise ValueError(f"Faults need delay_s, drop_every, cut_after_bytes >= 0: {self}")
        if not 0.0 <= self.drop_probability <= 1.0:
            raise ValueError(f"drop_probability must be in [0, 1], got {self.drop_probability}")


def http_response(
    status: int, reason: str, body: bytes = b"", kind: str = "application/xml"
) -> bytes:
    """A complete HTTP/1.1 response that closes its connection (for `Faults.answer`)."""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Counts:
    """What went through: connections accepted, requests seen, requests cut, refusals."""

    connections: int = 0
    requests: int = 0
    dropped: int = 0
    refused: int = 0
    answered: int = 0
    bytes_down: int = 0  # bytes the server sent back through the proxy
    by_request: dict[str, int] = field(default_factory=dict)  # "GET /bucket/key": bytes down


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream; `cut_left` counts down a doomed response."""

    client: socket.socket
    upstream: socket.socket
    awaiting_request: bool = True
    cut_left: int | None = None
    request: str = ""  # the request line's method and path (query left out) being answered
    closed: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        with self.lock:  # both pumps close a link when either side ends
            if self.closed.is_set():
                return
            self.closed.set()
        # SO_LINGER 0: the client sees a reset, as when a store's connection dies.
        with contextlib.suppress(OSError):
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _request_key(data: bytes) -> str:
    """'GET /bucket/key' from the first bytes of a request (the query string left out)."""
    method, _, rest = data.split(b"\r\n", 1)[0].partition(b" ")
    path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
    return f"{method.decode(errors='replace')} {path.decode(errors='replace')}"


class FaultProxy:
    """Listens on 127.0.0.1:`port`, forwards to `target`, injects `faults`."""

    def __init__(
        self, target: tuple[str, int], faults: Faults | None = None, max_connections: int = 256
    ) -> None:
        self.target = target
        self.faults = faults or Faults()
        self.counts = Counts()
        self._max = max_connections
        self._lock = threading.Lock()
        self._rng = random.Random(self.faults.seed)
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = "127.0.0.1", self._listener.getsockname()[1]
        self._start(self._accept_loop, "accept")

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, reset every live connection, join every thread."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() on Linux
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=10)

    # -- internals ----------------------------------------------------------------------

    def _start(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=f"proxy-{name}", daemon=True)
        thread.start()  # before it is listed: close() joins only started threads
        with self._lock:
            self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                full = len(self._links) >= self._max
                self.counts.refused += full
            if full:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.add(link)
                self.counts.connections += 1
            self._start(self._client_to_server, "up", link)
            self._start(self._server_to_client, "down", link)

    def _doomed(self) -> bool:
        """Whether the request starting now is cut (counted under the lock)."""
        faults = self.faults
        with self._lock:
            self.counts.requests += 1
            n = self.counts.requests
            cut = (faults.drop_every > 0 and n % faults.drop_every == 0) or (
                faults.drop_probability > 0 and self._rng.random() < faults.drop_probability
            )
            self.counts.dropped += cut
        return cut

    def _client_to_server(self, link: _Link) -> None:
        try:
            while data := link.client.recv(_CHUNK):
                if link.awaiting_request:
                    link.awaiting_request = False
                    link.request = _request_key(data)
                    if self.faults.delay_s:
                        time.sleep(self.faults.delay_s)  # the injected round trip
                    if self.faults.answer:
                        self._answer(link, self.faults.answer)
                        return
                    if self._doomed():
                        if self.faults.cut_after_bytes == 0:
                            break
                        link.cut_left = self.faults.cut_after_bytes
                link.upstream.sendall(data)
        except OSError:
            pass
        self._forget(link)

    def _answer(self, link: _Link, response: bytes) -> None:
        """Answer in the server's place, then close gracefully (a reset could reach the client
        before the response): stop sending, drain what the client still sends, close."""
        with self._lock:
            self.counts.answered += 1
        try:
            link.client.sendall(response)
            link.client.shutdown(socket.SHUT_WR)
            link.client.settimeout(5)
            while link.client.recv(_CHUNK):
                pass
        except OSError:
            pass
        with link.lock:
            link.closed.set()
        for sock in (link.upstream, link.client):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked on the upstream
            sock.close()
        with self._lock:
            self._links.discard(link)

    def _server_to_client(self, link: _Link) -> None:
        try:
            while data := link.upstream.recv(_CHUNK):
                link.awaiting_request = True
                if link.cut_left is not None:
                    link.client.sendall(data[: link.cut_left])
                    link.cut_left -= min(len(data), link.cut_left)
                    if link.cut_left == 0:
                        break
                    continue
                link.client.sendall(data)
                with self._lock:
                    self.counts.bytes_down += len(data)
                    by = self.counts.by_request
                    by[link.request] = by.get(link.request, 0) + len(data)
            else:  # the server closed after answering (moto does, each request): a FIN
                link.client.shutdown(socket.SHUT_WR)  # after the bytes still in flight,
                return  # not a reset that drops them; the client's close ends the link
        except OSError:
            pass
        self._forget(link)

    def _forget(self, link: _Link) -> None:
        link.close()
        with self._lock:
            self._links.discard(link)
