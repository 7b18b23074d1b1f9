"""A mixture in real processes: two ranks on Gloo with two DataLoader workers each save a
checkpoint file; one rank resumes from it. Global steps equal an uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
import torch.multiprocessing as mp

from loader import StreamingDataLoader
from loader.checkpoint import load
from tests.mix_job import GLOBAL_BATCH, mixture, run_rank
from tests.net import free_port
from tests.tables import lancedb_table, make_rows

pytestmark = pytest.mark.slow  # starts other processes


def test_two_ranks_with_workers_save_one_rank_resumes(tmp_path: Path) -> None:
    db, folder = tmp_path / "db", tmp_path / "pq"
    lancedb_table(db, rows=120)
    folder.mkdir()
    pq.write_table(make_rows(10_000, 10_045), folder / "part-0.parquet")
    reference = StreamingDataLoader(
        mixture(str(db), str(folder), 0, 1), global_batch_size=GLOBAL_BATCH
    )
    whole = []
    while len(whole) < 20:  # across the mixture's epoch end (the LanceDB pass ends in step 14)
        whole.extend(
            sorted(zip(b["source"].tolist(), b["id"].tolist(), strict=True)) for b in reference
        )
    path = tmp_path / "mix.json"
    out = tmp_path / "out"
    out.mkdir()
    job = {"db": str(db), "folder": str(folder), "steps": 8, "save": str(path), "out": str(out)}
    mp.start_processes(run_rank, args=(2, free_port(), job), nprocs=2, start_method="spawn")
    ranks = [orjson.loads((out / f"rank{r}.json").read_bytes())["batches"] for r in range(2)]
    steps = [sorted(tuple(x) for r in ranks for x in r[t]) for t in range(8)]
    assert steps == whole[:8]
    resumed = StreamingDataLoader(
        mixture(str(db), str(folder), 0, 1), global_batch_size=GLOBAL_BATCH
    )
    resumed.load_state_dict(load(path))
    after = []
    while len(after) < 12:
        after.extend(
            sorted(zip(b["source"].tolist(), b["id"].tolist(), strict=True)) for b in resumed
        )
    assert after[:12] == whole[8:20]
