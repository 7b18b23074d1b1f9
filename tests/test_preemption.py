"""Issue 26: preemption. SIGTERM to every process of a job mid-epoch (launcher, ranks and
DataLoader workers, as SLURM or Kubernetes send it): the workers outlive it, so the ranks
finish the step, agree to stop, write the emergency checkpoint and exit; the resume from
`checkpoint.latest` reads every row once (tests/preempt_job.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loader import checkpoint
from tests.mesh_job import table
from tests.multinode import REPO
from tests.net import free_port, wait_until
from tests.preempt_job import CHECK_EVERY, GLOBAL_BATCH, NUM_ROWS

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)


def run_job(tmp_path: Path, job: dict[str, object]) -> subprocess.Popen[bytes]:
    spec = tmp_path / f"job-{len(list(tmp_path.glob('job-*')))}.json"
    spec.write_bytes(orjson.dumps({**job, "port": free_port()}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = (tmp_path / f"{spec.stem}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.preempt_job", str(spec)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def logged(tmp_path: Path, phase: str) -> list[list[int]]:
    return [
        orjson.loads(line)
        for rank in range(2)
        for line in (tmp_path / f"{phase}-rank{rank}.jsonl").read_bytes().splitlines()
    ]


def test_sigterm_to_every_process_mid_epoch_then_resume(tmp_path: Path) -> None:
    uri = tmp_path / "rows.lance"
    table(uri, 0, NUM_ROWS)
    job = {"uri": str(uri), "ckpt": f"{tmp_path}/ckpt/", "out": str(tmp_path)}
    first = run_job(tmp_path, job)
    try:
        paused = [tmp_path / f"paused-{r}" for r in range(2)]
        wait_until(lambda: all(p.exists() for p in paused), 300, "both ranks at the pause")
        os.killpg(first.pid, signal.SIGTERM)  # every process: launcher, ranks, workers
        assert first.wait(timeout=300) == 0, (tmp_path / "job-0.log").read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    latest = checkpoint.latest(job["ckpt"])
    assert latest is not None, "no emergency checkpoint"
    before = logged(tmp_path, "first")
    assert len(before) == 2 * CHECK_EVERY, "both ranks stopped at the step they agreed on"

    resumed = run_job(tmp_path, {**job, "resume": True})
    assert resumed.wait(timeout=300) == 0, (tmp_path / "job-1.log").read_text()
    rows = [i for batch in before + logged(tmp_path, "resume") for i in batch]
    assert sorted(rows) == list(range(NUM_ROWS)), "every row once across the preemption"
    assert len(rows) == NUM_ROWS and GLOBAL_BATCH * (NUM_ROWS // GLOBAL_BATCH) == NUM_ROWS
