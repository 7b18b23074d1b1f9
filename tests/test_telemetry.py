"""The telemetry client: events arrive, and a bad collector never costs the training loop.

"Never blocks" is checked as a budget, not a profile: 20,000 `on_batch` calls while the
collector refuses, hangs or rejects must take well under a second in total, one
`TelemetryWarning` is issued, and `close()` returns within its bound.
"""

from __future__ import annotations

import gc
import http.server
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dashboard.launch import DashboardHandle, start_dashboard
from loader.telemetry.client import TelemetryClient, TelemetryWarning, event_value
from tests.net import get_json, serving, wait_until

STATIC: dict[str, Any] = {
    "rank": 1,
    "local_rank": 1,
    "world_size": 2,
    "num_workers": 0,
    "num_splits": 8,
}
STATIC |= {"rows_per_split": 100, "batch_size": 4, "host": "test-host"}


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardHandle]:
    db = tmp_path_factory.mktemp("telemetry") / "t.db"
    with start_dashboard(port=0, db=str(db), ui=False) as handle:
        yield handle


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A server that accepts connections into its backlog and never answers: 'slow'."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_events_reach_the_collector(collector: DashboardHandle) -> None:
    client = TelemetryClient(collector.api_url, "run-a", STATIC, interval_s=0.05, timeout_s=10)
    cursors = [0] * 8
    client.set_snapshot(lambda: {"epoch": 0, "step": 9, "splits": [4, 8], "cursors": cursors})
    for i in range(36):
        cursors[4 + i % 4] += 1  # the loader's full S-length vector: only [4, 8) is sent
        client.on_batch(4, 0.001)
    client.event("checkpoint_saved", path=Path("/ck/1.json"), step=np.int64(9), epoch=0)
    client.close()
    assert client.dropped == 0 and client.sent >= 2
    placement = get_json(collector.api_url + "/api/runs/run-a/placement")
    [rank] = placement["current"]["ranks"]
    assert (rank["rank"], rank["splits"], rank["cursors"]) == (1, [4, 8], [9, 9, 9, 9])
    assert rank["host"] == "test-host"
    [saved] = get_json(collector.api_url + "/api/runs/run-a/events?kind=checkpoint_saved")["data"]
    assert (saved["kind"], saved["step"], saved["data"]) == (
        "checkpoint_saved",
        9,
        {"path": "/ck/1.json"},
    )
    series = get_json(collector.api_url + "/api/runs/run-a/throughput?window_s=60")
    assert series["count"] >= 1


@pytest.mark.parametrize("failure", ["refused", "silent", "rejected"])
@pytest.mark.slow
def test_a_bad_collector_costs_one_warning_and_no_time(
    failure: str, silent_port: int, tmp_path: Path
) -> None:
    handle = None
    if failure == "rejected":  # a collector that wants a token the rank does not have
        handle = start_dashboard(port=0, token="s3cret", db=str(tmp_path / "r.db"), ui=False)
        url = handle.api_url
    else:
        port = _refused_port() if failure == "refused" else silent_port
        url = f"http://127.0.0.1:{port}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client = TelemetryClient(url, "run-b", STATIC, interval_s=0.02, timeout_s=0.3)
            start = time.perf_counter()
            for _ in range(20_000):
                client.on_batch(4, 0.0)
            assert time.perf_counter() - start < 1.0
            wait_until(lambda: client.dropped > 0, 30, "a dropped event")
            for _ in range(100):
                client.event("epoch_end", epoch=0)
            start = time.perf_counter()
            client.close()
            assert time.perf_counter() - start < 1.0
        ours = [w for w in caught if issubclass(w.category, TelemetryWarning)]
        assert len(ours) == 1, [str(w.message) for w in ours]
        assert client.sent == 0
    finally:
        if handle is not None:
            handle.stop()


def test_the_queue_is_bounded(silent_port: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TelemetryWarning)
        client = TelemetryClient(
            f"http://127.0.0.1:{silent_port}", "run-c", STATIC, timeout_s=0.2, max_queue=8
        )
        start = time.perf_counter()
        for _ in range(1000):
            client.event("checkpoint_saved", step=1)
        assert time.perf_counter() - start < 0.5  # a full queue drops, it never waits
        client.close(timeout_s=5)  # let the in-flight and final sends time out
        assert client.sent == 0 and client.dropped >= 1000  # every event (and tick) dropped


@pytest.mark.filterwarnings("ignore::loader.telemetry.client.TelemetryWarning")
def test_settings_come_from_arguments_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ELASTIC_LOADER_TELEMETRY", "ELASTIC_LOADER_RUN_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("MASTER_ADDR", "node7")
    assert TelemetryClient.from_settings(None, "x", STATIC) is None
    url = f"http://127.0.0.1:{_refused_port()}"
    monkeypatch.setenv("ELASTIC_LOADER_TELEMETRY", url)
    clients = [TelemetryClient.from_settings(None, None, STATIC)]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "elastic-42")
    clients.append(TelemetryClient.from_settings(None, None, STATIC))
    monkeypatch.setenv("ELASTIC_LOADER_RUN_ID", "from-env")
    clients.append(TelemetryClient.from_settings(None, None, STATIC))
    clients.append(TelemetryClient.from_settings(url, "explicit", STATIC))
    assert [c.run_id for c in clients if c] == ["node7-29500", "elastic-42", "from-env", "explicit"]
    for c in clients:
        assert c is not None and c.endpoint == url + "/api/events"
        c.close()


def test_fields_become_json_the_collector_accepts() -> None:
    assert event_value(Path("/a/b")) == "/a/b"
    assert event_value(np.int64(3)) == 3 and isinstance(event_value(np.int64(3)), int)
    assert event_value(np.arange(3)) == [0, 1, 2]
    assert event_value((1, 2)) == [1, 2]
    assert event_value({"nested": 1}) == "{'nested': 1}"
    assert event_value(None) is None


def test_a_run_id_the_collector_cannot_serve_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="without '/'"):
        TelemetryClient("http://127.0.0.1:9", "team/run-1", STATIC)


def test_a_discrete_event_goes_out_at_once(collector: DashboardHandle) -> None:
    """A checkpoint shows on the timeline now, not at the next tick (here a minute away)."""
    client = TelemetryClient(collector.api_url, "run-d", STATIC, interval_s=60, timeout_s=10)
    client.event("checkpoint_saved", step=7, epoch=0)
    url = collector.api_url + "/api/runs/run-d/timeline"
    wait_until(lambda: get_json(url, otherwise={}).get("count") == 1, 30, "the event")
    client.close()


def test_a_dropped_loader_ends_its_sender(collector: DashboardHandle) -> None:
    """The client holds the snapshot weakly: collecting the loader flushes and ends it."""

    class Loader:
        def snapshot(self) -> dict[str, Any]:
            return {"epoch": 0, "step": 3, "splits": [4, 8], "cursors": [1, 1, 1, 0]}

    loader = Loader()
    client = TelemetryClient(collector.api_url, "run-e", STATIC, interval_s=60, timeout_s=10)
    client.set_snapshot(loader.snapshot)
    del loader
    gc.collect()
    url = collector.api_url + "/api/runs/run-e/placement"
    wait_until(lambda: get_json(url, otherwise=None), 30, "the final flush, long before 60 s")
    wait_until(lambda: client.sent == 2, 30, "the final progress event and `closed`")


# --- issue #10 items 11 and 21, issue #14 item 1 -----------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every request with `self.server.answer` and records what it got."""

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, dict(self.headers)))  # type: ignore[attr-defined]
        status, location = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _any

    def log_message(self, *args: Any) -> None:
        pass


def _recording_server(status: int, location: str = "") -> Any:
    return serving(_Recorder, seen=[], answer=(status, location))


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_the_token_never_follows_a_redirect(code: int) -> None:
    """A collector URL that redirects elsewhere must not receive the bearer token there."""
    with _recording_server(202) as other, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        target = f"http://127.0.0.1:{other.server_address[1]}/steal"
        with _recording_server(code, target) as redirector:
            url = f"http://127.0.0.1:{redirector.server_address[1]}"
            client = TelemetryClient(url, "run-r", STATIC, token="s3cret", interval_s=0.02)
            wait_until(lambda: client.dropped > 0, 30, "a dropped event")
            client.close()
            assert redirector.seen  # the collector URL got the events (with its token)...
        assert other.seen == []  # ...and nothing, token or not, reached the other origin
        assert client.sent == 0
        ours = [w for w in caught if issubclass(w.category, TelemetryWarning)]
        assert len(ours) == 1 and "redirect" in str(ours[0].message)


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:8765", "http://127.0.0.1:notaport", "ftp://127.0.0.1:21", "http://", "http://[::1"],
)
def test_a_malformed_url_is_a_clear_error_at_construction(url: str) -> None:
    """Issue: such URLs killed the sender thread with a traceback, after the job started."""
    with pytest.raises(ValueError, match=r"Invalid telemetry URL .*e\.g\. telemetry="):
        TelemetryClient(url, "run-u", STATIC)


def test_close_sends_a_closed_event(collector: DashboardHandle) -> None:
    """Issue #14.1: a finished rank says so (with its last position); a crashed one cannot."""
    client = TelemetryClient(collector.api_url, "run-f", STATIC, interval_s=60, timeout_s=10)
    client.set_snapshot(lambda: {"epoch": 2, "step": 40, "splits": [4, 8], "cursors": [0] * 4})
    client.close()
    [closed] = get_json(collector.api_url + "/api/runs/run-f/events?kind=closed")["data"]
    assert (closed["rank"], closed["epoch"], closed["step"]) == (1, 2, 40)
    assert closed["data"] == {"reason": "close"}


EXITING_RANK = """
import sys
from loader.telemetry.client import TelemetryClient
static = {static!r}
for url in sys.argv[2:]:
    TelemetryClient(url, sys.argv[1], static, interval_s=0.05, timeout_s=2.0)
print("exiting", flush=True)
"""


@pytest.mark.slow
def test_exit_is_bounded_across_clients_and_sends_closed(
    collector: DashboardHandle, silent_port: int
) -> None:
    """Five clients, four of them to a collector that never answers: exit waits ~2 s in all.

    Before: each client was closed in turn, each waiting up to 2 x its 2 s timeout (16 s+).
    The one client whose collector answers gets its `closed` event (reason `exit`) through.
    """
    silent = [f"http://127.0.0.1:{silent_port}"] * 4
    code = EXITING_RANK.format(static=STATIC)
    cmd = [sys.executable, "-W", "ignore", "-c", code, "run-x", *silent, collector.api_url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "exiting"
    start = time.monotonic()
    assert proc.wait(30) == 0
    assert time.monotonic() - start < 4.0  # the 2 s budget plus interpreter teardown
    [closed] = get_json(collector.api_url + "/api/runs/run-x/events?kind=closed")["data"]
    assert closed["data"] == {"reason": "exit"}


def test_the_warning_says_why_the_collector_refused(collector: DashboardHandle) -> None:
    """A run id reused with another S is refused (409): the one warning says what to do."""
    first = TelemetryClient(collector.api_url, "run-s", STATIC, interval_s=60, timeout_s=10)
    first.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other = {**STATIC, "num_splits": 16}
        second = TelemetryClient(collector.api_url, "run-s", other, interval_s=60, timeout_s=10)
        second.close()
    [warning] = [w for w in caught if issubclass(w.category, TelemetryWarning)]
    assert "409" in str(warning.message) and "ELASTIC_LOADER_RUN_ID" in str(warning.message)


def test_a_dropped_loader_sends_closed(collector: DashboardHandle) -> None:
    """Issue #14.1: a loader that is garbage-collected is finished, not crashed: `closed`."""
    from loader import StreamingDataLoader, StreamingDataset
    from tests.tables import make_rows

    ds = StreamingDataset(make_rows(0, 64), num_splits=4, rank=0, world_size=1)
    loader = StreamingDataLoader(ds, batch_size=16, telemetry=collector.api_url, run_id="run-gc")
    assert len(list(loader)) == 4
    client = loader._telemetry.client
    del loader
    gc.collect()
    url = collector.api_url + "/api/runs/run-gc/events?kind=closed"
    wait_until(lambda: get_json(url, otherwise={}).get("count") == 1, 30, "the event")
    wait_until(lambda: not client._thread.is_alive(), 30, "the sender's end")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ELASTIC_LOADER_TELEMETRY": "not a url"}, "$ELASTIC_LOADER_TELEMETRY='not a url'"),
        (
            {"ELASTIC_LOADER_TELEMETRY": "http://127.0.0.1:9", "ELASTIC_LOADER_RUN_ID": "a/b"},
            "$ELASTIC_LOADER_RUN_ID='a/b'",
        ),
    ],
)
def test_a_bad_telemetry_environment_is_one_warning_and_the_job_runs(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    """Issue 19: `ELASTIC_LOADER_TELEMETRY='not a url'` failed the job (a traceback) instead
    of one warning; the same value passed as the argument stays an error."""
    from loader import StreamingDataLoader, StreamingDataset
    from tests.tables import make_rows

    for name in ("ELASTIC_LOADER_TELEMETRY", "ELASTIC_LOADER_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ds = StreamingDataset(make_rows(0, 100), num_splits=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dl = StreamingDataLoader(ds, batch_size=10)
        assert sum(len(b["id"]) for b in dl) == 100
    ours = [w for w in caught if issubclass(w.category, TelemetryWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert named in str(ours[0].message) and "telemetry is off" in str(ours[0].message)
    assert dl._telemetry.client is None  # the no-op reporter: telemetry is off
    with pytest.raises(ValueError, match="Invalid telemetry"):
        StreamingDataLoader(ds, batch_size=10, telemetry="not a url", run_id="a/b")
