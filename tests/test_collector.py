"""The collector's API through FastAPI's TestClient, and once through a real uvicorn.

Every bad request must get its 4xx *and* leave the database byte-for-byte as it was; every
view must agree with the contract's placement and with the models published in OpenAPI.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

import loader
from dashboard import charts
from dashboard.client import CollectorClient
from dashboard.collector import answers, models
from dashboard.collector.config import Settings
from dashboard.collector.deps import get_settings
from dashboard.collector.main import create_app
from dashboard.launch import run_dashboard, start_dashboard
from dashboard.placement import RankRate, owners, stragglers
from dashboard.synthetic import SyntheticRun, post_events, synthetic_events
from loader.layout import owned_splits, supported_world_sizes
from loader.tools import cli
from tests.collector_api import JSON, LOCAL, collector_client, dump, post
from tests.net import free_port, get_bytes, get_json

# Two hours ago on a whole hour: recent enough for the collector's clock window.
T0 = float(int(time.time()) // 3600 * 3600 - 7200)
BEFORE = SyntheticRun("job", 8, 48, 20_000, 30, T0, slow_rank=5, checkpoint_every=10)
AFTER = SyntheticRun(
    "job", 4, 48, 20_000, 20, T0 + 31, slow_rank=2, world_size_before=8, start_rows=60_000
)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "c.db") as c:
        yield c


def _ingest_resumed_run(client: TestClient, t0: float = T0) -> None:
    """BEFORE then AFTER, shifted to start at `t0` (now - 51: AFTER's ranks are live)."""
    for run in (BEFORE, AFTER):
        shifted = dataclasses.replace(run, start_ts=run.start_ts - T0 + t0)
        assert post(client, synthetic_events(shifted)).status_code == 202


def _good() -> dict[str, Any]:
    return next(iter(synthetic_events(BEFORE)))


def test_placement_follows_the_contract() -> None:
    assert supported_world_sizes(12) == [1, 2, 3, 4, 6, 12]
    assert owned_splits(2, 4, 12) == range(6, 9)
    assert owners(4, 8) == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match=r"supports world sizes \[1, 2, 3, 4, 6, 12\]"):
        owners(5, 12)


def test_stragglers_name_the_rank_that_waits() -> None:
    rates = [RankRate(r, 1000.0, 0.6 if r == 3 else 0.02) for r in range(6)]
    rates.append(RankRate(6, 500.0, 0.02))
    reasons = stragglers(rates)
    assert [r for r, why in enumerate(reasons) if why] == [3, 6]
    assert "waits for data" in reasons[3] and "median" in reasons[6]


def test_views_of_a_resumed_run(client: TestClient) -> None:
    _ingest_resumed_run(client, time.time() - 51)
    runs = client.get("/api/runs").json()
    assert runs["count"] == 1
    run = runs["data"][0]
    assert (run["world_size"], run["prev_world_size"], run["ranks"]) == (4, 8, 4)

    placement = client.get("/api/runs/job/placement").json()
    assert placement["current"]["owner"] == owners(4, 48)
    assert placement["previous"]["owner"] == owners(8, 48)
    assert [r["splits"] for r in placement["current"]["ranks"]] == [
        [owned_splits(r, 4, 48).start, owned_splits(r, 4, 48).stop] for r in range(4)
    ]
    assert 12 in placement["supported_world_sizes"]

    progress = client.get("/api/runs/job/progress").json()
    rows_per_rank = 60_000 + 20 * 2000
    assert progress["rows_done"] == 4 * rows_per_rank
    cursors = progress["cursors"]
    for lo in range(0, 48, 12):  # round-robin over the rank's 12 splits: even to one row
        assert sum(cursors[lo : lo + 12]) == rows_per_rank
        assert max(cursors[lo : lo + 12]) - min(cursors[lo : lo + 12]) <= 1
    assert progress["eta_s"] == pytest.approx((48 * 20_000 - 4 * rows_per_rank) / 8000)

    assert progress["state"] == "running" and progress["epoch_pct"] == pytest.approx(
        100 * rows_per_rank / 12 / 20_000
    )
    assert progress["unit"] == "rows" and progress["rows_per_split"] == 20_000
    assert progress["tokens_done"] is progress["tokens_per_s"] is None  # rows, not packed

    timeline = client.get("/api/runs/job/timeline").json()["data"]
    labels = [item["label"] for item in timeline]
    assert "resumed: W 8 → 4 at step 1,875" in labels
    assert "checkpoint saved (W 8) at step 625" in labels
    saved = next(i for i in timeline if i["label"] == "checkpoint saved (W 8) at step 625")
    assert saved["path"] == "checkpoints/step-000625.json"

    tp = client.get("/api/runs/job/throughput", params={"window_s": 15}).json()
    assert [s["rank"] for s in tp["stragglers"]] == [2]
    assert tp["tokens_per_s"] is None
    assert tp["input"]["bound"] == [2] and tp["input"]["verdict"] == "input-bound on rank 2"
    assert [s["rank"] for s in tp["slowest"]][:1] != [] and all(
        p["ranks"] == 4 and p["min"] <= p["median"] <= p["max"] for p in tp["band"]
    )


def test_responses_match_the_published_models(client: TestClient) -> None:
    _ingest_resumed_run(client)
    views: dict[str, type[BaseModel]] = {
        "/health": models.HealthPublic,
        "/api/runs": answers.RunsPublic,
        "/api/runs/job": answers.RunPublic,
        "/api/runs/job/placement": answers.PlacementPublic,
        "/api/runs/job/progress": answers.ProgressPublic,
        "/api/runs/job/throughput": answers.ThroughputPublic,
        "/api/runs/job/events": answers.EventsPublic,
        "/api/runs/job/timeline": answers.TimelinePublic,
    }
    for path, model in views.items():
        response = client.get(path)
        assert response.status_code == 200, path
        model.model_validate(response.json())
    spec = client.get("/openapi.json").json()
    assert "/api/events" in spec["paths"] and "/api/runs/{run_id}/placement" in spec["paths"]


def test_throughput_is_downsampled(client: TestClient) -> None:
    _ingest_resumed_run(client)
    for window, points, bucket in [(60, 6, 10.0), (3600, 30, 120.0), (40, 40, 1.0)]:
        tp = client.get("/api/runs/job/throughput", params={"window_s": window, "points": points})
        body = tp.json()
        assert body["bucket_s"] == bucket
        assert len(body["band"]) <= points + 1
        for p in body["band"]:
            assert abs(p["median"] - 2000) < 1e-6 and abs(p["min"] - p["max"]) < 1e-6


def _bad(field: str, value: Any) -> dict[str, Any]:
    event = _good()
    if value is ...:
        del event[field]
    else:
        event[field] = value
    return {"events": [event]}


BAD_BODIES = {
    "rank as string": _bad("rank", "0"),
    "ts as string": _bad("ts", "yesterday"),
    "negative cursor": _bad("cursors", [1, -2]),
    "splits of 3": _bad("splits", [0, 1, 2]),
    "missing run_id": _bad("run_id", ...),
    "missing world_size": _bad("world_size", ...),
    "unknown field": _bad("gpu_temp", 80),
    "bad kind": _bad("kind", "DROP TABLE"),
    "empty batch": {"events": []},
    "no events key": {"event": [_good()]},
    "too many events": {"events": [_good()] * (models.MAX_EVENTS + 1)},
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_invalid_events_are_422_and_store_nothing(client: TestClient, name: str) -> None:
    _ingest_resumed_run(client)
    before = dump(client)
    response = client.post("/api/events", content=orjson.dumps(BAD_BODIES[name]), headers=JSON)
    assert response.status_code == 422, response.text
    assert dump(client) == before


def test_malformed_json_is_422(client: TestClient) -> None:
    response = client.post("/api/events", content=b'{"events": [', headers=JSON)
    assert response.status_code == 422
    assert dump(client) == []


def test_oversized_body_is_413_and_stores_nothing(tmp_path: Path) -> None:
    with collector_client(tmp_path / "o.db", max_body_bytes=4096) as client:
        post(client, [_good()])
        before = dump(client)
        big = [_good()] * 40  # ~20 kB
        assert post(client, big).status_code == 413
        assert dump(client) == before


def test_token_is_required_when_set(tmp_path: Path) -> None:
    app = create_app(Settings(db=str(tmp_path / "t.db")))
    app.dependency_overrides[get_settings] = lambda: Settings(
        db=str(tmp_path / "t.db"), token="s3cret"
    )
    with TestClient(app, base_url=LOCAL) as client:
        post(client, [_good()], Authorization="Bearer s3cret")
        before = dump(client)
        missing = post(client, [_good()])
        wrong = post(client, [_good()], Authorization="Bearer nope")
        assert (missing.status_code, wrong.status_code) == (401, 403)
        assert client.get("/api/runs").status_code == 401
        assert client.get("/health").json()["token_required"] is True
        assert dump(client) == before


def test_unknown_run_is_404(client: TestClient) -> None:
    assert client.get("/api/runs/nope/placement").status_code == 404


def test_binding_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--token"):
        create_app(Settings(db=str(tmp_path / "x.db"), host="0.0.0.0"))
    create_app(Settings(db=str(tmp_path / "x.db"), host="0.0.0.0", token="t"))


def test_late_event_of_the_old_world_does_not_flip_placement(client: TestClient) -> None:
    _ingest_resumed_run(client)
    late = dict(_good(), ts=T0 + 5)  # an 8-rank event that arrives after the resume
    assert post(client, [late]).status_code == 202
    run = client.get("/api/runs/job").json()
    assert (run["world_size"], run["prev_world_size"]) == (4, 8)


@pytest.mark.slow
def test_real_uvicorn_on_loopback(tmp_path: Path) -> None:
    with start_dashboard(port=0, db=str(tmp_path / "u.db"), ui=False) as handle:
        assert handle.api_url.startswith("http://127.0.0.1:")
        assert post_events(handle.api_url, synthetic_events(AFTER), chunk=16) == 4 * 21
        # Ingest answers 202 after the commit: the events are readable at once.
        assert get_json(handle.api_url + "/health")["events"] == 4 * 21
        assert get_json(handle.api_url + "/api/runs/job/placement")["num_splits"] == 48


def test_cli_refuses_a_public_bind_without_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ELASTIC_LOADER_DASHBOARD_TOKEN", raising=False)
    assert run_dashboard(host="0.0.0.0", port=0, ui_port=0, db=str(tmp_path / "x.db")) == 2
    assert "--token" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    """`elastic-loader dashboard` prints its URLs, serves both parts, exits 0 on SIGTERM."""
    port, ui_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "loader.tools.cli", "dashboard", "--port", str(port)]
    cmd += ["--ui-port", str(ui_port), "--db", str(tmp_path / "cli.db")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once both parts answer
        assert first.startswith(f"Dashboard:  http://127.0.0.1:{ui_port}")
        assert get_json(f"http://127.0.0.1:{port}/health")["status"] == "ok"
        assert b"<title>" in get_bytes(f"http://127.0.0.1:{ui_port}/")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_charts_draw_every_view(client: TestClient) -> None:
    """The dashboard's Altair specs build from real responses, also before ranks report."""
    post(client, synthetic_events(BEFORE))
    resumed = SyntheticRun("job", 4, 48, 20_000, 0, T0 + 31, world_size_before=8)
    post(client, synthetic_events(resumed))  # the resume is known, no W = 4 rank reported yet
    placement = client.get("/api/runs/job/placement").json()
    progress = client.get("/api/runs/job/progress").json()
    throughput = client.get("/api/runs/job/throughput").json()
    timeline = client.get("/api/runs/job/timeline").json()["data"]
    assert placement["current"]["ranks"] == [] and progress["cursors"] == [None] * 48
    specs = [
        charts.placement_grid(placement["current"], 48, "now"),
        charts.placement_grid(placement["previous"], 48, "before"),
        charts.progress_grid(progress),
        charts.band_chart(throughput["band"], "rows/s"),
        charts.band_chart([], "rows/s"),
        charts.band_chart(throughput["band"], "rows/s", crashed_at=T0 + 30),
        charts.timeline_chart(timeline),
        charts.timeline_chart(timeline, by_step=True),
    ]
    for spec in specs:
        assert spec.to_dict()["$schema"].startswith("https://vega.github.io/schema/vega-lite/")


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_a_taken_ui_port_fails_fast_and_leaks_no_fd(tmp_path: Path) -> None:
    """Issue #10.23: every `start_dashboard(ui=True)` leaked the log file's descriptor."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        fds = _open_fds()
        start = time.monotonic()
        # named before Streamlit starts (issue 25: it used to answer with the other's URL)
        with pytest.raises(RuntimeError, match=r"\(--ui-port\) is already in use"):
            start_dashboard(port=0, ui_port=taken.getsockname()[1], db=str(tmp_path / "p.db"))
        assert time.monotonic() - start < 30  # not the 60 s readiness deadline
        assert _open_fds() - fds == set()


@pytest.mark.slow
def test_the_loader_does_not_import_the_dashboard() -> None:
    """Issue #11.4: `loader` (CLI and telemetry included) imports nothing from `dashboard`."""
    code = "import sys, loader.tools.cli, loader.telemetry.client, loader.wire; "
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dashboard'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for path in Path(loader.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "dashboard" for n in names), path


def test_importing_the_collector_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No app at import: a bad environment only fails when the factory runs."""
    monkeypatch.setenv("ELASTIC_LOADER_DASHBOARD_KEEP_RUNS", "many")
    main = importlib.reload(importlib.import_module("dashboard.collector.main"))
    assert not hasattr(main, "app")
    with pytest.raises(ValueError, match="ELASTIC_LOADER_DASHBOARD_KEEP_RUNS='many'"):
        main.create_app()


def test_a_missing_dashboard_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "DASHBOARD_ENTRY", "no_such_package.launch")
    assert cli.main(["dashboard", "--port", "1"]) == 2
    assert "dashboard is not importable" in capsys.readouterr().err


@pytest.mark.slow
def test_the_dashboard_command_is_forwarded() -> None:
    """`elastic-loader dashboard ARGS` runs the dashboard's own entry point with ARGS."""
    for cmd in (["loader.tools.cli", "dashboard"], ["dashboard.launch"]):
        out = subprocess.run(
            [sys.executable, "-m", *cmd, "--help"], capture_output=True, text=True, check=True
        )
        assert "--ui-port" in out.stdout and "--token" in out.stdout, cmd


@pytest.mark.slow
def test_any_printable_run_id_round_trips(tmp_path: Path) -> None:
    """Run ids with spaces or unicode reach the dashboard's client, URL-quoted."""
    with start_dashboard(port=0, db=str(tmp_path / "q.db"), ui=False) as handle:
        run = SyntheticRun("llama 7b · try #2", 2, 4, 100, 2, T0)
        post_events(handle.api_url, synthetic_events(run))
        client = CollectorClient(handle.api_url)
        assert [r["run_id"] for r in client.runs()] == [run.run_id]
        assert client.placement(run.run_id)["current"]["owner"] == [0, 0, 1, 1]
