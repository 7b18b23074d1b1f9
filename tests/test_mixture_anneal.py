"""Issue 27's Gloo job: 2 ranks x 2 workers anneal a mixture 6:3:1 -> 2:5:3, once through
`schedule=` and once through `set_weights`, are killed, and resume on W = 3: the loss equals
an uninterrupted single-process run's at every step."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
import torch.multiprocessing as mp

from tests import anneal_job as job
from tests.net import free_port
from tests.tables import make_rows

pytestmark = pytest.mark.slow  # starts other processes

STEPS = 18
SAVE_AT = {"schedule": 14, "set_weights": 6}  # after the switch, and before it


def test_an_annealed_mixture_killed_on_two_ranks_resumes_on_three(tmp_path: Path) -> None:
    folders = []
    for k, (first, stop, _) in enumerate(job.TABLES):
        folder = tmp_path / f"t{k}"
        folder.mkdir()
        pq.write_table(make_rows(first, stop), folder / "part-0.parquet")
        folders.append(str(folder))
    want = {}
    for mode in SAVE_AT:  # the uninterrupted run: one process, W = 1, no workers
        dl = job.loader(folders, mode, 0, 1, resumed=False)
        want[mode] = job.train(dl, 1e-4, STEPS, job.hook_for(mode, 0, {}))
    assert want["schedule"] == want["set_weights"]  # the same phases, declared or online
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
    base = {"folders": folders, "steps": STEPS, "modes": SAVE_AT, "save": str(tmp_path)}
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        mp.start_processes(
            job.run_rank,
            args=(2, free_port(), base | {"out": str(first)}),
            nprocs=2,
            start_method="spawn",
        )
    resumed = base | {"out": str(second), "resume": str(tmp_path)}
    mp.start_processes(job.run_rank, args=(3, free_port(), resumed), nprocs=3, start_method="spawn")
    for mode, save_at in SAVE_AT.items():
        killed = [orjson.loads((first / f"rank{r}.json").read_bytes())[mode] for r in range(2)]
        after = [orjson.loads((second / f"rank{r}.json").read_bytes())[mode] for r in range(3)]
        assert all(r["losses"] == killed[0]["losses"] for r in killed)  # one loss a step
        assert all(r["losses"] == after[0]["losses"] for r in after)
        got = killed[0]["losses"][:save_at] + after[0]["losses"]
        assert len(got) == STEPS
        for t, (a, b) in enumerate(zip(got, want[mode], strict=True)):
            assert math.isclose(a, b, rel_tol=1e-12), (mode, t, a, b)
        assert killed[0]["losses"][save_at:] == pytest.approx(
            want[mode][save_at : save_at + 2], rel=1e-12
        )
    for r in range(2):  # other arguments on one rank: an error on every rank, then agreed
        note = orjson.loads((first / f"rank{r}.json").read_bytes())["set_weights"]["mismatch"]
        assert "rank 1 were given other weights" in note
