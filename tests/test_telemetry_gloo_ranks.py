"""A real job: 2 Gloo ranks with telemetry on, a collector in its own process.

One spawned pair covers both promises, to pay for importing torch and LanceDB only once:
1. mid-epoch, the collector's view (both ranks, their splits, their cursors) equals what
   each loader's own `state_dict()` says;
2. the collector is then SIGKILLed; training finishes, every row of the epoch is read
   exactly once across the ranks, and each rank got exactly one `TelemetryWarning`.
Ranks and test meet through small files in `tmp_path` (no sleeps: polls with deadlines).
"""

from __future__ import annotations

import functools
import signal
import warnings
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import orjson
import pyarrow as pa
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from dashboard.launch import start_collector_process
from loader import StreamingDataLoader, StreamingDataset
from loader.layout import owned_splits
from loader.telemetry.client import TelemetryWarning
from tests.net import free_port, get_json, wait_until

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

NUM_ROWS, NUM_SPLITS, BATCH, FIRST = 960, 8, 10, 20
RUN = "gloo-run"


def _reported_cursors(api: str, rank: int) -> list[int] | None:
    placement = get_json(f"{api}/api/runs/{RUN}/placement", 2, otherwise=None)
    if not placement:
        return None
    mine = [r for r in placement["current"]["ranks"] if r["rank"] == rank]
    return mine[0]["cursors"] if mine else None


def _ours(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, TelemetryWarning)]


def _write(path: Path, body: Any) -> None:
    """Whole or not at all: the test polls for the file while the rank writes it."""
    path.with_suffix(".tmp").write_bytes(orjson.dumps(body))
    path.with_suffix(".tmp").replace(path)


def _rank(rank: int, port: int, db: str, api: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            table = lancedb.connect(db).open_table("items")
            ds = StreamingDataset(table, columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=3)
            dl = StreamingDataLoader(ds, batch_size=BATCH, telemetry=api, run_id=RUN)
            it = iter(dl)
            ids = [i for _ in range(FIRST) for i in next(it)["id"].tolist()]
            splits = owned_splits(rank, 2, NUM_SPLITS)
            lo, hi = splits.start, splits.stop
            mine = dl.state_dict()["cursors"][lo:hi]
            wait_until(
                lambda: _reported_cursors(api, rank) == mine, 30, "the collector to catch up"
            )
            _write(Path(out, f"mid-{rank}.json"), {"cursors": mine})
            wait_until(lambda: Path(out, "killed").exists(), 30, "the test to kill the collector")
            ids += [i for batch in it for i in batch["id"].tolist()]
            wait_until(lambda: _ours(caught), 30, "the sender to notice the dead collector")
        _write(Path(out, f"done-{rank}.json"), {"ids": ids, "warnings": len(_ours(caught))})
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_report_and_survive_a_dead_collector(tmp_path: Path) -> None:
    db = str(tmp_path / "lance")
    ids = np.arange(NUM_ROWS, dtype=np.int64)
    lancedb.connect(db).create_table("items", pa.table({"id": ids}))
    collector, api = start_collector_process(tmp_path / "events.db")
    try:
        ctx = mp.spawn(_rank, args=(free_port(), db, api, str(tmp_path)), nprocs=2, join=False)
        mids = [
            wait_until(
                functools.partial(_read, tmp_path / f"mid-{r}.json"), 120, f"rank {r} mid-run"
            )
            for r in range(2)
        ]
        placement = get_json(f"{api}/api/runs/{RUN}/placement", 2, otherwise=None)
        assert [r["rank"] for r in placement["current"]["ranks"]] == [0, 1]
        assert placement["current"]["owner"] == [0, 0, 0, 0, 1, 1, 1, 1]
        for r, mid in enumerate(mids):
            reported = placement["current"]["ranks"][r]
            owned = owned_splits(r, 2, NUM_SPLITS)
            assert reported["splits"] == [owned.start, owned.stop]
            assert reported["cursors"] == mid["cursors"]
            assert sum(mid["cursors"]) == FIRST * BATCH
        collector.send_signal(signal.SIGKILL)
        collector.wait(10)
        (tmp_path / "killed").touch()
        while not ctx.join(timeout=60):
            pass
        done = [_read(tmp_path / f"done-{r}.json") for r in range(2)]
        read = sorted(i for d in done for i in d["ids"])
        assert read == list(range(NUM_ROWS))  # every row once, none twice
        assert [d["warnings"] for d in done] == [1, 1]
    finally:
        if collector.poll() is None:
            collector.kill()
            collector.wait(10)


def _read(path: Path) -> Any:
    return orjson.loads(path.read_bytes()) if path.exists() else None
