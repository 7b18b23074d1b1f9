"""Issue 34: Ray Train as the launcher (examples/ray_train.py, run as a user would): 2 Ray
workers, one SIGKILLed mid-epoch (Ray restarts both from the last checkpoint they reported),
then `ScalingConfig(num_workers=(2, 3))` grown to 3 workers resuming the same run. Each step's
rows are the latest attempt's; together: every row once an epoch, and each global step the
rows of an uninterrupted run's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loader import StreamingDataLoader, StreamingDataset

pytestmark = pytest.mark.slow  # starts a Ray cluster and its workers

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ray_train.py"


def test_ray_train_killed_worker_then_elastic_3_workers(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--work-dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == {"steps": 40, "worlds": [2, 3], "every_row_once": True}
    assert (tmp_path / "killed").exists(), "no worker was killed"
    spec = importlib.util.spec_from_file_location("ray_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    attempts = {p.name.split("-")[0] for p in tmp_path.glob("*-w*-rank*.jsonl")}
    assert len(attempts) == 3, "first run, its restart after the kill, the elastic run"
    ds = StreamingDataset(
        str(tmp_path / "rows.lance"), columns=["id"], num_splits=example.NUM_SPLITS,
        shuffle_seed=3,
    )  # fmt: skip
    dl = StreamingDataLoader(ds, global_batch_size=example.GLOBAL_BATCH)
    want = [sorted(b["id"].tolist()) for _ in range(example.EPOCHS) for b in dl]
    assert example.check(tmp_path)["batches"] == want, "not the uninterrupted run's batches"
