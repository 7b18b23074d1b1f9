"""The fault-injecting proxy finds each request on a kept-alive connection, delays and cuts it."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.netproxy import FaultProxy, Faults
from tests.object_store import S3Server


def _get(conn: http.client.HTTPConnection, path: str) -> int:
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    return response.status


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps connections open (moto closes each one)

    def do_GET(self) -> None:
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Closing(_KeepAlive):
    protocol_version = "HTTP/1.0"  # answers, then closes the connection, as moto does
    body = bytes(range(256)) * 4096  # 1 MiB: fits the loopback socket buffers

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[tuple[str, int]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def closing_server() -> Iterator[tuple[str, int]]:
    yield from _serve(_Closing)


@pytest.fixture
def keep_alive_server() -> Iterator[tuple[str, int]]:
    yield from _serve(_KeepAlive)


def test_each_request_on_a_kept_alive_connection_is_delayed_and_counted(
    keep_alive_server: tuple[str, int],
) -> None:
    with FaultProxy(keep_alive_server, Faults(delay_s=0.1)) as proxy:
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=10)
        start = time.monotonic()
        statuses = [_get(conn, "/") for _ in range(3)]
        elapsed = time.monotonic() - start
        conn.close()
        assert statuses == [200, 200, 200]
        assert (proxy.counts.connections, proxy.counts.requests) == (1, 3)
        assert elapsed >= 0.3, "every request waited, not only the connection's first"
    assert not [t for t in threading.enumerate() if t.name.startswith("proxy-")], "all joined"


@pytest.mark.slow
def test_every_kth_request_is_cut_and_the_rest_pass(s3_server: S3Server) -> None:
    bucket = s3_server.make_bucket()
    with FaultProxy((s3_server.host, s3_server.port), Faults(drop_every=2)) as proxy:
        outcomes = []
        for _ in range(4):
            conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=10)
            try:
                outcomes.append(_get(conn, f"/{bucket}?list-type=2"))
            except (ConnectionError, http.client.HTTPException):
                outcomes.append("cut")
            conn.close()
        assert outcomes == [200, "cut", 200, "cut"]
        assert proxy.counts.dropped == 2


def test_a_server_closing_after_its_answer_delivers_it_whole_once(
    closing_server: tuple[str, int],
) -> None:
    """The server closing its side ends the client's response with a FIN after every byte,
    not a reset that drops what the client has not read yet: the AWS SDK retried such
    responses (the proxy then counted the bytes twice, issue #35's 2-2.6x)."""
    with FaultProxy(closing_server) as proxy:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 15)  # the rest waits in
        client.settimeout(10)  # the proxy's send buffer until the client reads it
        client.connect((proxy.host, proxy.port))
        client.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 30
        for pump in [t for t in threading.enumerate() if t.name == "proxy-down"]:
            pump.join(max(0.0, deadline - time.monotonic()))
            assert not pump.is_alive(), "the proxy never saw the server close"
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while piece := client.recv(1 << 16):
                received += piece
        client.close()
        body = received.partition(b"\r\n\r\n")[2]
        assert len(body) == len(_Closing.body), "the tail was dropped by a reset"
        assert body == _Closing.body
        assert proxy.counts.bytes_down == len(received)
        assert proxy.counts.by_request == {"GET /x": len(received)}


def test_bad_faults_are_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="drop_probability"):
        Faults(drop_probability=1.5)
    with pytest.raises(ValueError, match="delay_s"):
        Faults(delay_s=-1)
