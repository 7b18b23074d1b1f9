"""The collector under test: in-process, an app on its own database behind FastAPI's
TestClient, and the few calls the collector's tests make on it (written once here); or as
a deployment runs it, plain uvicorn in its own process (`collector_process`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from fastapi.testclient import TestClient

from dashboard.collector.config import ENV_DB, ENV_HOST, ENV_TOKEN, Settings
from dashboard.collector.main import create_app
from dashboard.synthetic import SyntheticRun, synthetic_events
from tests.net import free_port

# TestClient's default Host ("testserver") is not one the collector serves.
LOCAL = "http://127.0.0.1"
JSON = {"Content-Type": "application/json"}


@contextlib.contextmanager
def collector_process(
    db: Path, bind: str = "127.0.0.1", env_host: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`uvicorn --factory dashboard.collector.main:create_app --host BIND`, no token, in its
    own process (no test's GIL slows its answers); the process and its URL, stopped after."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_HOST, ENV_TOKEN)}
    env[ENV_DB] = str(db)
    if env_host:
        env[ENV_HOST] = env_host
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "dashboard.collector.main:create_app"]
    cmd += ["--host", bind, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env)
    try:
        yield proc, f"http://{bind}:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.contextmanager
def collector_client(db: Path, **settings: Any) -> Iterator[TestClient]:
    """A collector app on `db` (further `Settings` fields in `settings`), started."""
    with TestClient(create_app(Settings(db=str(db), **settings)), base_url=LOCAL) as client:
        yield client


def post(client: TestClient, events: Iterable[Any] | bytes, **headers: str) -> Any:
    """POST events (or a raw body) to the ingest route; the response, whatever it is."""
    body = events if isinstance(events, bytes) else orjson.dumps({"events": list(events)})
    return client.post("/api/events", content=body, headers={**JSON, **headers})


def post_runs(client: TestClient, *runs: SyntheticRun) -> None:
    """Each synthetic run's events, accepted."""
    for run in runs:
        response = post(client, synthetic_events(run))
        assert response.status_code == 202, response.text


def view(client: TestClient, run_id: str, name: str, **params: Any) -> Any:
    """A run's view as JSON, e.g. `view(client, "job", "status")`."""
    response = client.get(f"/api/runs/{run_id}/{name}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def dump(client: TestClient) -> list[Any]:
    """Every row of every table: what 'the database is unchanged' means."""
    store = client.app.state.store  # type: ignore[attr-defined]
    if store is None:
        return []
    tables = [r[0] for r in store.query("SELECT name FROM sqlite_master WHERE type='table'")]
    return [(t, [tuple(r) for r in store.query(f"SELECT * FROM {t}")]) for t in sorted(tables)]
