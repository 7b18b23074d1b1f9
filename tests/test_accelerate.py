"""Issue 26: Accelerate. `accelerator.prepare(dl)` hands our loader back untouched (also with
dispatch_batches=True, which used to fail on one rank and hang the other), and the
documented recipe, `accelerator.register_for_checkpointing(dl)`, saves on 2 processes and
resumes on 3, every row once (tests/accelerate_job.py)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests import accelerate_job
from tests.accelerate_job import GLOBAL_BATCH, NUM_ROWS, SAVED_AT
from tests.mesh_job import table
from tests.net import free_port
from tests.test_distributed import join_or_fail

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)


def test_accelerate_prepare_and_register_for_checkpointing(tmp_path: Path) -> None:
    uri = tmp_path / "rows.lance"
    table(uri, 0, NUM_ROWS)
    job = {"uri": str(uri), "state": str(tmp_path / "state"), "out": str(tmp_path)}
    for world in (2, 3):
        join_or_fail(accelerate_job.run, (world, free_port(), job), nprocs=world, limit_s=600)
    runs = {
        w: [orjson.loads((tmp_path / f"w{w}-rank{r}.json").read_bytes()) for r in range(w)]
        for w in (2, 3)
    }
    assert all(r["untouched"] for w in runs for r in runs[w]), "prepare wrapped the loader"
    assert [len(r["batches"]) for r in runs[2]] == [SAVED_AT] * 2
    steps = NUM_ROWS // GLOBAL_BATCH - SAVED_AT
    assert [len(r["batches"]) for r in runs[3]] == [steps] * 3
    rows = [i for w in runs for r in runs[w] for batch in r["batches"] for i in batch]
    assert sorted(rows) == list(range(NUM_ROWS)), "every row once across the resume"
