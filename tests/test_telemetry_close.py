"""How a rank's telemetry ends: the `closed` event's reason, its position, its delivery.

Issue #19 item 8 and "a finished job shown as crashed": a job that dies of an uncaught
exception must not read "closed normally"; a spawned child's last event must not race its
`os._exit`; a lost first try of the last send is retried; a collected loader's `closed`
carries its last position, not none.
"""

from __future__ import annotations

import http.server
import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from dashboard.launch import DashboardHandle, start_dashboard
from loader.telemetry.client import TelemetryClient
from tests.net import get_json, serving, wait_until

STATIC: dict[str, Any] = {"rank": 0, "world_size": 1, "num_splits": 4, "rows_per_split": 10}


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardHandle]:
    db = tmp_path_factory.mktemp("close") / "c.db"
    with start_dashboard(port=0, db=str(db), ui=False) as handle:
        yield handle


def _closed(api: str, run: str) -> list[dict[str, Any]]:
    return list(get_json(f"{api}/api/runs/{run}/events?kind=closed")["data"])


class _Loader:
    """Stands in for a loader: the client holds its snapshot method weakly."""

    def snapshot(self) -> dict[str, Any]:
        return {"epoch": 1, "step": 7, "global_step": 17, "splits": [0, 4], "cursors": [3] * 4}


def test_a_collected_loader_closes_at_its_last_position(collector: DashboardHandle) -> None:
    """Before: the last tick found the loader gone and `closed` carried no step at all."""
    client = TelemetryClient(collector.api_url, "pos", STATIC, interval_s=0.05, timeout_s=5)
    loader = _Loader()
    client.set_snapshot(loader.snapshot)
    wait_until(lambda: client.sent > 0, 30, "a first progress event")
    del loader  # the loader is collected: the client's last batch goes out now
    client._thread.join(10)
    [closed] = _closed(collector.api_url, "pos")
    assert (closed["epoch"], closed["step"], closed["global_step"]) == (1, 7, 17)
    assert closed["data"] == {"reason": "close"}


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Refuses the first `server.fail` POSTs with 503, then accepts and records the body."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server: Any = self.server
        server.tries += 1
        ok = server.tries > server.fail
        if ok:
            server.bodies.append(orjson.loads(body))
        self.send_response(202 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _flaky(fail: int) -> Any:
    return serving(_Flaky, tries=0, fail=fail, bodies=[])


def test_the_last_send_is_retried_within_the_budget() -> None:
    """Two 503s in a row (a loaded collector): the `closed` event still arrives, once."""
    with _flaky(fail=2) as server, pytest.warns(RuntimeWarning):
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = TelemetryClient(url, "retry", STATIC, interval_s=60, timeout_s=1)
        client.close(timeout_s=5)
    kinds = [e["kind"] for body in server.bodies for e in body["events"]]
    assert kinds == ["progress", "closed"] and server.tries == 3


def test_a_refusal_is_not_retried() -> None:
    """A 4xx would be refused again: one try, `close()` returns at once."""
    with _flaky(fail=10**6) as server, pytest.warns(RuntimeWarning):
        server.RequestHandlerClass = _Refusing
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = TelemetryClient(url, "refused", STATIC, interval_s=60, timeout_s=1)
        client.close(timeout_s=5)
    assert server.tries == 1


class _Refusing(_Flaky):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.tries += 1  # type: ignore[attr-defined]
        self.send_response(422)
        self.send_header("Content-Length", "0")
        self.end_headers()


UNCAUGHT = """
import sys
from loader.telemetry.client import TelemetryClient
client = TelemetryClient(sys.argv[1], "uncaught", {static!r}, interval_s=60, timeout_s=5)
raise ValueError("the secret message stays on this host")
"""


@pytest.mark.slow
def test_an_uncaught_exception_closes_with_reason_error(collector: DashboardHandle) -> None:
    """Before: the at-exit `closed` said `exit`, and the dashboard read "Finished"."""
    code = UNCAUGHT.format(static=STATIC)
    proc = subprocess.run(
        [sys.executable, "-c", code, collector.api_url], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "ValueError" in proc.stderr  # the traceback still prints
    [closed] = _closed(collector.api_url, "uncaught")
    assert closed["data"] == {"reason": "error", "error": "ValueError"}  # the type, no message
    status = get_json(f"{collector.api_url}/api/runs/uncaught/status")
    assert status["state"] == "crashed" and "ValueError" in status["headline"]


def _child(url: str, run_id: str, fail: bool) -> None:
    """A spawned rank's target: its loader goes out of scope as it returns (no close())."""
    client = TelemetryClient(url, run_id, STATIC, interval_s=60, timeout_s=5)
    loader = _Loader()
    client.set_snapshot(loader.snapshot)
    if fail:
        raise RuntimeError("boom")


@pytest.mark.slow
def test_a_spawned_child_delivers_its_closed_event(collector: DashboardHandle) -> None:
    """Before: the collected loader's last send raced the child's `os._exit` and was lost
    (the dashboard said "Crashed" for a job that exited 0); a child that raises says so."""
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(target=_child, args=(collector.api_url, f"spawned-{fail}", fail))
        for fail in (False, True)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [c.exitcode for c in children] == [0, 1]
    [ok] = _closed(collector.api_url, "spawned-False")
    assert ok["data"]["reason"] in ("close", "exit")
    [failed] = _closed(collector.api_url, "spawned-True")
    assert failed["data"] == {"reason": "error", "error": "RuntimeError"}


@pytest.mark.filterwarnings("ignore::loader.telemetry.client.TelemetryWarning")
def test_several_loaders_close_together_under_one_deadline() -> None:
    """Issue 24 item 19: three loaders reporting to a collector that never answers took one
    close budget each, one after the other; `close_loaders` gives them one deadline."""
    import socket

    from loader import StreamingDataLoader, StreamingDataset, close_loaders
    from tests.tables import make_rows

    silent = socket.socket()  # accepts connections into its backlog, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        loaders = [
            StreamingDataLoader(
                StreamingDataset(make_rows(0, 40), num_splits=2),
                batch_size=4,
                telemetry=url,
                run_id=f"silent-{k}",
            )
            for k in range(3)
        ]
        for dl in loaders:
            next(iter(dl))
        close_loaders(*loaders, timeout_s=1.0)
        clients = [dl._telemetry.client for dl in loaders]
        assert all(c is not None and c._stop.is_set() for c in clients)
        assert len({c._final_by for c in clients if c is not None}) == 1  # one deadline
        close_loaders(*loaders)  # closed already: nothing more to wait for
    finally:
        silent.close()
