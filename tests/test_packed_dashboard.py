"""Packed runs on the dashboard: tokens, not only rows (issue #13 item 4).

A real packed loader (a LanceDB table of token lists) reports to a real collector on
127.0.0.1; the progress and throughput views then count blocks (the unit of a packed
run's cursors) and tokens. An older database gains the token columns on open.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa

from dashboard.collector.models import EventIn
from dashboard.collector.schema import SCHEMA
from dashboard.collector.store import Store
from dashboard.launch import start_dashboard
from loader import StreamingDataLoader, StreamingDataset
from tests.net import get_json, wait_until

SEQ_LEN, BATCH, STEPS, SPLITS = 8, 2, 5, 4


def _view(api: str, run: str, view: str) -> dict[str, Any]:
    """The view's JSON, or {} while the run is not known yet (404)."""
    return dict(get_json(f"{api}/api/runs/{run}/{view}", otherwise={}))


def _token_table(path: Path) -> Any:
    docs = [[d * 100 + k + 1 for k in range(3 + d % 11)] for d in range(120)]
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
    return lancedb.connect(str(path)).create_table("docs", table)


def test_a_packed_run_shows_tokens_and_tokens_per_s(tmp_path: Path) -> None:
    table = _token_table(tmp_path / "lance")
    with start_dashboard(port=0, db=str(tmp_path / "d.db"), ui=False) as handle:
        ds = StreamingDataset(
            table, columns=["tokens"], num_splits=SPLITS, shuffle_seed=3,
            pack_sequences=SEQ_LEN, eos_id=0,
        )  # fmt: skip
        blocks = ds.units_per_split(0)
        dl = StreamingDataLoader(ds, batch_size=BATCH, telemetry=handle.api_url, run_id="lm")
        it = iter(dl)
        for _ in range(STEPS):
            next(it)
        handed = STEPS * BATCH  # blocks
        progress = wait_until(
            lambda: (p := _view(handle.api_url, "lm", "progress")).get("rows_done") == handed and p,
            30,
            f"{handed} blocks in the progress view",
        )
        throughput = _view(handle.api_url, "lm", "throughput")
        placement = _view(handle.api_url, "lm", "placement")
        dl.close()
    assert blocks != ds.rows_per_split, "the test needs blocks per split to differ from L"
    assert progress["unit"] == "blocks"
    assert progress["seq_len"] == SEQ_LEN
    assert progress["rows_per_split"] == blocks
    assert progress["rows_total"] == SPLITS * blocks
    assert progress["tokens_done"] == handed * SEQ_LEN
    assert progress["tokens_total"] == SPLITS * blocks * SEQ_LEN
    assert progress["tokens_per_s"] == progress["rows_per_s"] * SEQ_LEN
    assert progress["ranks"][0]["tokens"] == handed * SEQ_LEN
    assert progress["epoch_pct"] == 100.0 * handed / (SPLITS * blocks)
    [rank] = placement["current"]["ranks"]
    assert (rank["blocks_per_split"], rank["tokens"]) == (blocks, handed * SEQ_LEN)
    # tokens/s over the last 30 s: the rollup's tokens (blocks x seq_len) over its seconds
    rate = throughput["slowest"][0]["rows_per_s"]
    assert rate > 0
    assert abs(throughput["tokens_per_s"] - rate * SEQ_LEN) <= 1e-6 * rate * SEQ_LEN


def _packed_event(ts: float) -> EventIn:
    return EventIn(
        run_id="lm", kind="progress", ts=ts, rank=0, world_size=1, num_splits=2,
        rows_per_split=50, seq_len=16, tokens=64, blocks_per_split=9, splits=[0, 2],
        cursors=[2, 2], rows=4, batches=2, interval_s=1.0, rows_per_s=4.0,
    )  # fmt: skip


def test_an_older_database_gains_the_token_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the first release's schema: no token columns
        conn.executescript(SCHEMA)
    store = Store(path)
    try:
        store.ingest([_packed_event(1000.0), _packed_event(1001.0)], now=1001.0)
        run = store.run("lm")
        assert run is not None and run["seq_len"] == 16
        assert store.query("SELECT sum(tokens) FROM samples")[0][0] == 2 * 4 * 16
        assert store.query("SELECT tokens FROM rollup")[0][0] == 2 * 4 * 16
        [rank] = store.ranks("lm", 1)
        assert (rank["tokens"], rank["blocks_per_split"]) == (64, 9)
    finally:
        store.close()
