"""The collector refuses what could poison or expose it, with a 4xx and nothing stored.

Each test is one abuse from issue #10 (items 8, 9, 10, 13, 14, 21): who may connect, what
an event may claim, how much one client may create, what a malformed number does, and that
the OpenAPI document says all of it. Bad requests leave every table unchanged and the run
usable: every view of it still answers 200.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.collector.config import Settings
from dashboard.collector.guard import Guard
from dashboard.collector.main import create_app
from dashboard.collector.models import EventIn
from dashboard.collector.store import Retention, Store
from dashboard.synthetic import SyntheticRun, synthetic_events
from tests.collector_api import JSON, collector_client, collector_process, dump, post
from tests.net import wait_until

NOW = time.time()
LIVE = SyntheticRun("live", 4, 8, 1_000, 20, NOW - 30)
VIEWS = ("", "/placement", "/progress", "/throughput", "/events", "/timeline")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "h.db") as c:
        assert post(c, list(synthetic_events(LIVE))).status_code == 202
        yield c


def _event(**changes: Any) -> dict[str, Any]:
    """A valid progress event of rank 1 of the live run (W 4, S 8), with `changes`."""
    event = [e for e in synthetic_events(LIVE) if e["rank"] == 1][-1]
    return {**event, "ts": time.time(), **changes}


def _views_answer(client: TestClient, run_id: str = "live") -> None:
    for view in VIEWS:
        response = client.get(f"/api/runs/{run_id}{view}")
        assert response.status_code == 200, (view, response.text)


# --- 10.9: events must agree with themselves and with their run ---------------------------

WRONG_EVENTS = {
    "W does not divide S (issue: W=3, S=8)": _event(
        world_size=3, rank=1, splits=None, cursors=None
    ),
    "S of 2**24 (issue: 34 MB responses)": _event(num_splits=1 << 24, splits=None, cursors=None),
    "rank not below W": _event(rank=4, splits=None, cursors=None),
    "splits not the rank's": _event(splits=[0, 2]),
    "cursors not one per owned split": _event(cursors=[1, 2, 3]),
    "NaN-free but far-future ts (issue: ts=1e12)": _event(ts=1e12),
    "ts older than retention": _event(ts=NOW - 31 * 86400),
}


@pytest.mark.parametrize("name", sorted(WRONG_EVENTS))
def test_an_event_that_contradicts_itself_is_422(client: TestClient, name: str) -> None:
    before = dump(client)
    response = post(client, [WRONG_EVENTS[name]])
    assert response.status_code == 422, response.text
    assert dump(client) == before
    _views_answer(client)
    throughput = client.get("/api/runs/live/throughput").json()
    assert throughput["count"] > 0  # the live run's view is not emptied


def test_a_run_keeps_its_number_of_splits(client: TestClient) -> None:
    """Another S for a known run is 409: the layout of a run cannot change under its views."""
    before = dump(client)
    other = _event(num_splits=16, splits=[4, 8], cursors=[0] * 4)
    response = post(client, [other])
    assert response.status_code == 409 and "num_splits=8" in response.json()["detail"]
    assert dump(client) == before
    mixed = [_event(run_id="new"), _event(run_id="new", num_splits=16, splits=[4, 8])]
    mixed[1]["cursors"] = [0] * 4
    assert post(client, mixed).status_code == 409
    assert dump(client) == before
    _views_answer(client)


# --- 10.14: malformed numbers and text are 422, never 500 --------------------------------

# (field, raw JSON text): what Python's json accepts but no event may carry.
RAW_BAD = {
    "ts NaN": ("ts", b"NaN"),
    "ts Infinity": ("ts", b"Infinity"),
    "wait -Infinity": ("wait_s", b"-Infinity"),
    "rank beyond 64 bits": ("rank", b"1180591620717411303424"),
    "data int beyond 64 bits": ("data", b'{"x": 1180591620717411303424}'),
    "data list int beyond 64 bits": ("data", b'{"x": [1, 36893488147419103232]}'),
    "lone surrogate in host": ("host", b'"node\\ud800"'),
    "lone surrogate in data": ("data", b'{"path": "\\udfff"}'),
    "lone surrogate in a data key": ("data", b'{"\\ud800": 1}'),
    "lone surrogate in run_id": ("run_id", b'"run\\ud83d"'),
}


@pytest.mark.parametrize("name", sorted(RAW_BAD))
def test_malformed_numbers_and_text_are_422(client: TestClient, name: str) -> None:
    """Issue: each of these was a 500. Now 422, an error body that is JSON, nothing stored."""
    field, raw = RAW_BAD[name]
    event = _event(kind="checkpoint_saved", **{field: "__BAD__"})
    body = orjson.dumps({"events": [event]}).replace(b'"__BAD__"', raw)
    before = dump(client)
    response = post(client, body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"]
    assert dump(client) == before


# --- 10.10: bounded runs, retention, per-run cost ----------------------------------------


def test_one_request_cannot_create_many_runs(client: TestClient) -> None:
    before = dump(client)
    many = [_event(run_id=f"r{i}") for i in range(20)]
    response = post(client, many)
    assert response.status_code == 422 and "at most 8 runs" in response.text
    assert dump(client) == before


def test_retention_keeps_the_newest_runs(tmp_path: Path) -> None:
    with collector_client(tmp_path / "k.db", keep_runs=3) as client:
        for i in range(6):
            assert post(client, [_event(run_id=f"run-{i}", ts=NOW + i)]).status_code == 202
        runs = [r["run_id"] for r in client.get("/api/runs").json()["data"]]
        assert runs == ["run-5", "run-4", "run-3"]
        assert client.get("/api/runs/run-0/progress").status_code == 404
        store = client.app.state.store  # type: ignore[attr-defined]
        left = {
            r[0]
            for t in ("ranks", "samples", "rollup")
            for r in store.query(f"SELECT run_id FROM {t}")
        }
        assert left == {"run-3", "run-4", "run-5"}


def test_a_long_run_keeps_raw_samples_for_its_last_hours_only(tmp_path: Path) -> None:
    """A run that never ends must not grow without bound: old seconds live on in the rollup."""
    store = Store(tmp_path / "w.db", Retention(keep_samples_s=20_000))
    try:
        run = SyntheticRun("long", 2, 4, 10**9, 30, NOW - 25_000)
        late = SyntheticRun("long", 2, 4, 10**9, 30, NOW - 60, start_rows=60_000)
        for part in (run, late):
            store.ingest([EventIn.model_validate(e) for e in synthetic_events(part)], NOW)
        store.prune(NOW)
        kept = store.query("SELECT min(ts), count(*) FROM samples WHERE run_id = 'long'")[0]
        assert kept[0] >= NOW - 60 and kept[1] == 2 * 30
        rolled = store.query("SELECT sum(rows) FROM rollup WHERE run_id = 'long'")[0][0]
        assert rolled == 2 * 60 * 2000  # every second of both stretches, still summed
    finally:
        store.close()


def test_new_runs_are_rate_limited_so_spam_cannot_flush_retention(tmp_path: Path) -> None:
    """With keep_runs=100, 13 requests of 8 new runs would evict every real run: 429 instead."""
    with collector_client(tmp_path / "l.db", new_runs_per_minute=3) as client:
        assert post(client, [_event(run_id=f"a{i}") for i in range(3)]).status_code == 202
        before = dump(client)
        response = post(client, [_event(run_id="a0"), _event(run_id="spam")])
        assert response.status_code == 429 and response.headers["Retry-After"] == "60"
        assert dump(client) == before
        assert post(client, [_event(run_id="a1")]).status_code == 202  # known runs go on


def test_retention_drops_runs_silent_for_keep_days(tmp_path: Path) -> None:
    store = Store(tmp_path / "d.db", Retention(keep_runs=100, keep_days=30))
    try:
        store.ingest([EventIn.model_validate(_event(run_id="old", ts=NOW - 29 * 86400))], NOW)
        store.ingest([EventIn.model_validate(_event(run_id="new", ts=NOW))], NOW)
        assert store.prune(NOW + 2 * 86400) == 1  # "old" is now 31 days silent
        assert [r["run_id"] for r in store.runs()] == ["new"]
        assert store.query("SELECT count(*) FROM samples WHERE run_id = 'old'")[0][0] == 0
    finally:
        store.close()


def _steps(store: Store, run_id: str) -> int:
    """SQLite VM instructions (in hundreds) that `store.run(run_id)` executes: its cost."""
    conn = store._read()
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        assert store.run(run_id) is not None
    finally:
        conn.set_progress_handler(None, 100)
    return count[0]


def test_a_run_is_found_without_scanning_all_runs(tmp_path: Path) -> None:
    """Issue: 20,000 runs made every per-run request 50x slower. Cost must not grow with runs."""
    store = Store(tmp_path / "n.db", Retention(keep_runs=100_000, new_runs_per_minute=100_000))
    try:

        def add(first: int, n: int) -> None:
            for i in range(first, first + n, 8):
                batch = [_event(run_id=f"r{j}", ts=NOW) for j in range(i, min(i + 8, first + n))]
                store.ingest([EventIn.model_validate(e) for e in batch], NOW)

        add(0, 10)
        few = _steps(store, "r5")
        add(10, 2_000)
        many = _steps(store, "r5")
        assert many <= few + 2, (few, many)  # a full scan of 2,010 runs is ~100x more
    finally:
        store.close()


# --- 10.21: a rank owning more than 65,536 splits ----------------------------------------


def test_a_rank_owning_many_splits_is_accepted(client: TestClient) -> None:
    s = 1 << 17
    event = _event(run_id="wide", world_size=1, rank=0, num_splits=s, splits=[0, s])
    event["cursors"] = [3] * s
    assert post(client, [event]).status_code == 202
    progress = client.get("/api/runs/wide/progress").json()
    assert progress["rows_done"] == 3 * s


# --- 10.8 / 10.13: who may connect --------------------------------------------------------


def test_a_foreign_host_header_is_400(client: TestClient) -> None:
    """DNS rebinding: the browser sends the attacker's name as Host; refuse it."""
    before = dump(client)
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example", ""):
        response = post(client, [_event()], Host=host)
        assert response.status_code == 400, host
        assert client.get("/api/runs", headers={"Host": host}).status_code == 400
    assert dump(client) == before
    for host in ("127.0.0.1:8765", "localhost", "LOCALHOST:1", "[::1]:8765", "127.0.0.5"):
        assert client.get("/health", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_extend_the_host_check(tmp_path: Path) -> None:
    with collector_client(tmp_path / "a.db", allowed_hosts=("collector.internal",)) as client:
        assert client.get("/health", headers={"Host": "Collector.internal:87"}).status_code == 200
        assert client.get("/health", headers={"Host": "other.internal"}).status_code == 400


def test_without_a_token_another_local_address_is_refused_in_the_scope(tmp_path: Path) -> None:
    """ASGI path: a request arriving on an address the app was not started for is 403."""
    app = create_app(Settings(db=str(tmp_path / "s.db")))  # started for 127.0.0.1
    with TestClient(app, base_url="http://127.0.0.2") as client:
        assert post(client, [_event()]).status_code == 403
        assert client.get("/api/runs").status_code == 403
    token = Settings(db=str(tmp_path / "s.db"), host="0.0.0.0", token="t")
    with TestClient(create_app(token), base_url="http://127.0.0.2") as client:
        assert post(client, [_event()], Authorization="Bearer t").status_code == 202


def _status(url: str, body: bytes | None = None) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, body, JSON if body else {})
    try:
        with opener.open(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.mark.slow
def test_plain_uvicorn_on_another_address_without_token_serves_nothing(tmp_path: Path) -> None:
    """Issue: `uvicorn ...:app --host 0.0.0.0` without a token served POSTs.

    Binding 0.0.0.0 is not allowed in these tests (loopback only), so 127.0.0.2 stands for
    "an address the collector was not started for": the app reads the socket's own address
    per request. A second server told its address (ELASTIC_LOADER_DASHBOARD_HOST) serves.
    """
    body = orjson.dumps({"events": [_event()]})
    for env_host, expected in ((None, 403), ("127.0.0.2", 202)):
        with collector_process(tmp_path / f"{expected}.db", "127.0.0.2", env_host) as (_, url):
            wait_until(lambda: _status(url + "/health") != 0, 60, "uvicorn")
            assert _status(url + "/api/events", body) == expected
            assert _status(url + "/health") == (200 if expected == 202 else 403)


# --- 10.14: the OpenAPI document says what the routes answer -------------------------------


def test_openapi_documents_the_refusals(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    ingest = set(paths["/api/events"]["post"]["responses"])
    assert {"202", "400", "401", "403", "409", "413", "422", "429"} <= ingest
    for view in VIEWS:
        answers = set(paths["/api/runs/{run_id}" + view]["get"]["responses"])
        assert {"200", "400", "401", "403", "404", "422"} <= answers, view
    assert {"200", "400", "403"} <= set(paths["/health"]["get"]["responses"])


# --- every event the model accepts keeps every view answering ------------------------------


@settings(max_examples=30)
@given(
    st.integers(1, 64).flatmap(
        lambda w: st.tuples(st.just(w), st.integers(1, 16), st.integers(0, w - 1))
    ),
    st.integers(0, 10_000),
)
def test_any_accepted_event_keeps_the_views_answering(
    tmp_path_factory: pytest.TempPathFactory, layout: tuple[int, int, int], rows: int
) -> None:
    world, per_rank, rank = layout
    splits = [rank * per_rank, (rank + 1) * per_rank]
    event = _event(run_id="p", world_size=world, rank=rank, num_splits=world * per_rank)
    event.update(splits=splits, cursors=[rows] * per_rank, rows_per_split=rows)
    db = tmp_path_factory.mktemp("prop") / "p.db"
    with collector_client(db) as client:
        assert post(client, [event]).status_code == 202
        _views_answer(client, "p")


@pytest.mark.parametrize(
    ("server", "allowed"),
    [
        (("127.0.0.1", 8765), True),
        (("::ffff:127.0.0.1", 8765), True),  # IPv4 client of a dual-stack socket
        (("127.0.0.2", 8765), False),
        (("10.1.2.3", 8765), False),  # what a remote client of a 0.0.0.0 bind arrives on
        (("::1", 8765), False),
        (None, True),  # a unix socket: reachable only through the file system
    ],
)
def test_the_guard_reads_the_socket_address(server: Any, allowed: bool) -> None:
    guard = Guard(Settings(db="unused.db"))
    assert guard.address_allowed(server) is allowed
    assert Guard(Settings(db="unused.db", host="0.0.0.0", token="t")).address_allowed(server)


def test_a_long_mixture_run_keeps_its_latest_live_reports_only(tmp_path: Path) -> None:
    """Rank 0 of a mixture reports every 5 s for the whole run: each report supersedes the
    ones before, so retention keeps the latest `keep_live_reports` and every milestone."""
    store = Store(tmp_path / "m.db", Retention(keep_live_reports=3))
    try:
        live = [
            _event(kind="mixture_progress", run_id=run, ts=NOW + i, global_step=i, data={"k": i})
            for run, count in (("long", 10), ("short", 2))
            for i in range(count)
        ]
        saved = _event(kind="checkpoint_saved", run_id="long", ts=NOW, global_step=0)
        store.ingest([EventIn.model_validate(e) for e in [*live, saved]], NOW)
        store.prune(NOW + 10)
        kept = store.tuples("SELECT run_id, global_step FROM events ORDER BY run_id, ts")
        assert [k for k in kept if k[0] == "short"] == [("short", 0), ("short", 1)]
        assert [k for k in kept if k[0] == "long"] == [
            ("long", 0),
            ("long", 7),
            ("long", 8),
            ("long", 9),
        ]
        assert store.events("long", "checkpoint_saved", 10)  # milestones are never dropped
    finally:
        store.close()
