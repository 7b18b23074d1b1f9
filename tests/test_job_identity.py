"""Job identity (issue 33 item 9): the default run id is the launcher's job, and a resume
joins the run of its checkpoint (its lineage) as a new attempt."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import ENV_API
from dashboard.launch import start_dashboard
from loader.telemetry.settings import job_identity
from tests.net import free_port, get_json, wait_until

JOB = str(Path(__file__).with_name("identity_job.py"))
REPO = str(Path(__file__).resolve().parents[1])
TIMELINE = Path(__file__).parent.parent / "dashboard" / "screens" / "timeline.py"
LAUNCHERS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_WORLD_SIZE")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*LAUNCHERS, "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_job_comes_from_the_launcher(no_launcher: pytest.MonkeyPatch) -> None:
    env = no_launcher
    static = {"host": "node3"}
    assert job_identity(static) == (f"node3-{os.getpid()}",) * 2  # no launcher: this process
    env.setenv("SLURM_JOB_ID", "4242")
    assert job_identity(static)[0] == "slurm-4242"
    # plain torchrun on one node (`--master-port` given: its run id is "none"): its agent
    env.setenv("TORCHELASTIC_RUN_ID", "none")
    env.setenv("GROUP_WORLD_SIZE", "1")
    env.setenv("MASTER_ADDR", "127.0.0.1")
    env.setenv("MASTER_PORT", "29500")
    assert job_identity(static)[0] == "slurm-4242"  # SLURM's job id still names it
    env.delenv("SLURM_JOB_ID")
    job, attempt = job_identity(static)
    assert job.startswith(f"torchrun-node3-{os.getppid()}-") and attempt == job
    env.setenv("GROUP_WORLD_SIZE", "2")  # several nodes, no rendezvous id: the address
    assert job_identity(static)[0] == "127.0.0.1-29500"
    env.setenv("TORCHELASTIC_RUN_ID", "5f0c9a")  # --standalone or --rdzv-id
    env.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert job_identity(static) == ("5f0c9a", "5f0c9a-restart2")


def _torchrun(data: Path, checkpoint: Path, mode: str, port: int) -> subprocess.Popen[bytes]:
    """A torchrun job of 2 ranks with default telemetry settings but for `--master-port`
    (its static rendezvous: run id "none", `127.0.0.1-PORT` as the run id before)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return subprocess.Popen([*cmd, JOB, str(data), str(checkpoint), mode])


def _attempts(url: str, runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {r["run_id"]: get_json(f"{url}/api/runs/{r['run_id']}/attempts")["data"] for r in runs}


@pytest.mark.slow
def test_two_default_jobs_are_two_runs_and_a_resume_joins_its_run(
    tmp_path: Path, parquet_rows: Path, no_launcher: pytest.MonkeyPatch
) -> None:
    """Job A crashes after its checkpoint; job B starts fresh on the same address and port
    while A's resume (job C, its checkpoint) runs: two runs, A's with two attempts."""
    with start_dashboard(port=0, db=str(tmp_path / "c.db"), ui=False) as collector:
        url = collector.api_url
        no_launcher.setenv("ELASTIC_LOADER_TELEMETRY", url)
        no_launcher.delenv("ELASTIC_LOADER_RUN_ID", raising=False)
        no_launcher.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        port = free_port()
        assert _torchrun(parquet_rows, tmp_path / "a.ckpt", "crash", port).wait(300) != 0
        jobs = [
            _torchrun(parquet_rows, tmp_path / "b.ckpt", "fresh", port),
            _torchrun(parquet_rows, tmp_path / "a.ckpt", "resume", free_port()),
        ]
        assert [job.wait(300) for job in jobs] == [0, 0]

        def settled() -> dict[str, list[dict[str, Any]]] | None:
            runs = get_json(f"{url}/api/runs")["data"]
            attempts = _attempts(url, runs)
            done = sorted(len(a) for a in attempts.values()) == [1, 2]
            return attempts if done and all(r["ranks"] == 2 for r in runs) else None

        attempts = wait_until(settled, 60, "two runs, one of them with two attempts")
    resumed = next(a for a in attempts.values() if len(a) == 2)
    crashed, resume = resumed
    assert crashed["ended"] == {"silent": 2}, crashed  # killed: no `closed`
    assert "silent" not in resume["ended"], resume
    assert crashed["attempt"] in {r for r in attempts if len(attempts[r]) == 2}  # its job's id


def _post(url: str, events: list[dict[str, Any]]) -> None:
    body = orjson.dumps({"events": events})
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{url}/api/events", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202


def test_the_timeline_lists_a_runs_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash (no `closed`) and its resume (closed at exit): two rows, first first."""
    now = time.time()
    ev = {"run_id": "lm", "kind": "progress", "rank": 0, "world_size": 1, "num_splits": 2}
    crash = {**ev, "ts": now - 60, "attempt": "jobA"}
    resume = {**ev, "ts": now - 5, "attempt": "jobB"}
    closed = {**resume, "kind": "closed", "data": {"reason": "exit"}}
    with start_dashboard(port=0, db=str(tmp_path / "t.db"), ui=False) as collector:
        _post(collector.api_url, [crash])
        _post(collector.api_url, [resume, closed])
        monkeypatch.setenv(ENV_API, collector.api_url)
        page = AppTest.from_file(str(TIMELINE), default_timeout=60)
        page.session_state["run_id"] = "lm"
        page.run()
    assert not page.exception
    table = page.table[-1].value
    assert list(table.index) == ["1: jobA", "2: jobB"]
    assert list(table["processes ended"]) == ["1 silent", "1 exit"]
