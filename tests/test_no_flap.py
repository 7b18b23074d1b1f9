"""A healthy run reads Running the whole time (issue 25 item 1), with real loaders: two ranks
read and save a checkpoint every 1.05 s (each save's event wakes the sender: a short
interval, which used to shrink the stall threshold below the next heartbeat's gap), while the status and /metrics
are polled every 0.3 s for 20 s."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from dashboard.launch import DashboardHandle, start_dashboard
from loader import StreamingDataLoader, StreamingDataset, checkpoint
from tests.net import get_bytes, get_json

pytestmark = pytest.mark.slow  # 20 s of polling a real collector

POLL_S, FOR_S = 0.3, 20.0


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[DashboardHandle]:
    with start_dashboard(port=0, db=str(tmp_path / "flap.db"), ui=False) as handle:
        yield handle


def test_a_healthy_two_rank_run_reads_running_on_every_poll(
    collector: DashboardHandle, tmp_path: Path
) -> None:
    table = pa.table({"id": list(range(100_000))})
    loaders = [
        StreamingDataLoader(
            StreamingDataset(table, num_splits=4, shuffle_seed=1, rank=r, world_size=2),
            global_batch_size=8,
            telemetry=collector.api_url,
            run_id="healthy",
        )
        for r in range(2)
    ]
    running = [iter(dl) for dl in loaders]
    status_url = collector.api_url + "/api/runs/healthy/status"
    seen: list[tuple[float, str, str]] = []
    step, start, next_poll, saved = 0, None, 0.0, time.monotonic()
    try:
        while start is None or time.monotonic() - start < FOR_S:
            for it in running:
                next(it)
            step += 1
            if time.monotonic() - saved > 1.05:  # a checkpoint: its event is sent at once
                saved = time.monotonic()
                checkpoint.save(loaders[0].state_dict(), tmp_path / f"ckpt-{step % 3}.json")
            time.sleep(0.02)  # a training step
            now = time.monotonic()
            if now < next_poll:
                continue
            next_poll = now + POLL_S
            status = get_json(status_url, otherwise=None)
            if status is None or status["state"] == "starting":
                continue  # the first reports are on their way
            start = start or now
            metrics = get_bytes(collector.api_url + "/metrics").decode()
            stalled = 'elastic_loader_run_state{run_id="healthy",state="stalled"} 1.0' in metrics
            seen.append((now - start, status["headline"], "stalled in /metrics" if stalled else ""))
    finally:
        for dl in loaders:
            dl.close()
    assert len(seen) >= FOR_S / POLL_S / 2, len(seen)  # polled all along
    bad = [s for s in seen if not s[1].startswith("Running: 2 of 2") or s[2]]
    assert not bad, bad[:5]
