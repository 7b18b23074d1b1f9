"""Runs of every kind, fed to a collector by REAL in-process loaders (tests of what the pages
say about them: tests/test_dashboard_kinds_browser.py).

Each function builds `rank=`/`world_size=` loaders reporting to `api`, steps them together
as DDP ranks do, closes them and returns the facts the page must show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from loader import MixedDataset, StreamingDataLoader, StreamingDataset, checkpoint
from tests.batches import step_together

SEQ = 8


def _rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": list(range(start, start + n))})


def _docs(n: int, seed: int) -> pa.Table:
    """`n` documents of 2-7 tokens (never 0: the EOS id)."""
    docs = [[seed * 1000 + d * 10 + k + 1 for k in range(2 + (d * 7 + seed) % 6)] for d in range(n)]
    return pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})


def _loaders(build: Any, world: int, g: int, api: str, run: str) -> list[StreamingDataLoader]:
    return [
        StreamingDataLoader(
            build(r, world), global_batch_size=g, telemetry=api, run_id=run, total_epochs=2
        )
        for r in range(world)
    ]


def mixture_build(r: int, w: int, packed: bool, weights: list[int], **mix: Any) -> MixedDataset:
    """Rank `r` of `w` over web and code with `weights` (rows, or packed blocks of `SEQ`
    tokens): 400 and 200 rows or documents, S = 3 and 2; `mix`: MixedDataset's options."""
    kw: dict[str, Any] = {"rank": r, "world_size": w, "shuffle_seed": 1}
    if packed:
        kw |= {"columns": ["tokens"], "pack_sequences": SEQ, "eos_id": 0}
    web = StreamingDataset(_docs(400, 1) if packed else _rows(400), num_splits=3, **kw)
    code = StreamingDataset(_docs(200, 2) if packed else _rows(200, 1000), num_splits=2, **kw)
    return MixedDataset({"web": web, "code": code}, weights, **mix)


def mixture_run(api: str, run: str, steps: int, packed: bool) -> dict[str, Any]:
    """Two ranks over web:code = 3:1 (rows, or packed blocks of `SEQ` tokens), G = 8."""

    def build(r: int, w: int) -> MixedDataset:
        return mixture_build(r, w, packed, [3, 1])

    step_together(_loaders(build, 2, 8, api, run), steps)
    return {"rows": steps * 8, "web": steps * 6, "code": steps * 2}  # 3:1 of G = 8, exact


def resized_run(api: str, run: str, folder: Path) -> dict[str, Any]:
    """998 rows over S = 12 read by W = 4 for 20 steps of G = 12, saved, resumed by W = 3
    for 10 more: 360 of 998 rows read."""

    def build(r: int, w: int) -> StreamingDataset:
        return StreamingDataset(_rows(998), num_splits=12, shuffle_seed=3, rank=r, world_size=w)

    first = _loaders(build, 4, 12, api, run)
    step_together_keep(first, 20)
    state = first[0].state_dict()
    checkpoint.save(state, folder / "resized.json")
    for dl in first:
        dl.close()
    after = _loaders(build, 3, 12, api, run)
    for dl in after:
        dl.load_state_dict(state)
    step_together(after, 10)
    return {"rows": 12 * (20 + 10), "table_rows": 998}


def step_together_keep(ranks: list[StreamingDataLoader], steps: int) -> None:
    """`steps` batches of every rank, rank by rank, leaving the loaders open."""
    running = [iter(dl) for dl in ranks]
    for _ in range(steps):
        for it in running:
            next(it)
