"""Checkpoints reach the dashboard's timeline without a call the user must know about.

A real loader (one rank, telemetry on) and a real collector on 127.0.0.1: a checkpoint
written with `loader.checkpoint.save(dl.state_dict(), path)` and one written by
`torch.distributed.checkpoint.save` with the loader as a `Stateful` each arrive as a
`checkpoint_saved` event carrying the path; a stale state saved later, and a DCP load,
send nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
import torch.distributed.checkpoint as dcp

from dashboard.launch import start_dashboard
from loader import StreamingDataLoader, StreamingDataset, checkpoint
from tests.net import get_json, wait_until


def _events(api: str, run: str) -> list[dict[str, Any]]:
    url = f"{api}/api/runs/{run}/events?kind=checkpoint_saved"
    return list(get_json(url, 2, otherwise={"data": []})["data"])


@pytest.mark.slow
def test_checkpoint_save_and_dcp_save_reach_the_timeline(tmp_path: Path) -> None:
    table = lancedb.connect(str(tmp_path / "lance")).create_table(
        "rows", pa.table({"id": np.arange(2000, dtype=np.int64)})
    )
    with start_dashboard(port=0, db=str(tmp_path / "d.db"), ui=False) as handle:
        ds = StreamingDataset(table, num_splits=4, shuffle_seed=2)
        dl = StreamingDataLoader(
            ds, batch_size=10, telemetry=handle.api_url, run_id="ck", total_epochs=2
        )
        it = iter(dl)
        for _ in range(5):
            next(it)
        stale = dl.state_dict()
        next(it)
        saved = checkpoint.save(dl.state_dict(), tmp_path / "step-6.json")
        checkpoint.save(stale, tmp_path / "stale.json")  # not where the loader is: no event
        for _ in range(3):
            next(it)
        dcp.save({"loader": dl}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
        events = wait_until(
            lambda: len(_events(handle.api_url, "ck")) >= 2 and _events(handle.api_url, "ck"),
            30,
            "two checkpoint events",
        )
        dcp.load({"loader": dl}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)  # no event
        dl.close()
        events = _events(handle.api_url, "ck")
    assert [(e["data"]["path"], e["step"]) for e in events] == [
        (str(saved), 6),
        (str(tmp_path / "dcp"), 9),
    ]
    assert events[1]["data"]["via"] == "dcp"


def test_a_bad_job_length_names_the_argument(tmp_path: Path) -> None:
    table = lancedb.connect(str(tmp_path / "lance")).create_table(
        "rows", pa.table({"id": np.arange(100, dtype=np.int64)})
    )
    ds = StreamingDataset(table, num_splits=4)
    with pytest.raises(ValueError, match=r"total_epochs must be a positive int.*got 0"):
        StreamingDataLoader(ds, batch_size=10, total_epochs=0)
