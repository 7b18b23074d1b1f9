"""Issue 26: the loader on a DeviceMesh, on real Gloo meshes (tests/mesh_job.py).

One job of 6 processes (importing torch in each dominates; everything is checked from it):
a (dp=2, tp=2) job whose table grows while it starts, saved mid-epoch with DCP, resumed on
(3, 2) and on (1, 2); the refusals of a dataset without a mesh; pipeline stages that read;
a mixture on a mesh; a process that never builds the dataset, named by every other.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from loader.trainers.torchtitan import TitanDataLoader
from tests import mesh_job
from tests.mesh_job import (
    GLOBAL_BATCH,
    NUM_ROWS,
    SAVED_AT,
    TITAN_ROWS,
    TITAN_STEPS,
    titan_dataset,
    titan_step,
)
from tests.net import free_port
from tests.test_distributed import join_or_fail

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

AGREE_S = 20  # how long the agreement waits for a process that never comes


def by_step(seen: list[dict[str, Any]]) -> list[dict[int, list[list[int]]]]:
    """For each step, each data-parallel rank's batches (one per process of that rank)."""
    steps: list[dict[int, list[list[int]]]] = []
    for process in seen:
        for t, batch in enumerate(process["batches"]):
            while len(steps) <= t:
                steps.append(defaultdict(list))
            steps[t][process["dp"]].append(batch)
    return steps


def check_replicas(seen: list[dict[str, Any]], dp_size: int, replicas: int) -> list[list[int]]:
    """Every process of a dp rank got the same batches at every step, the dp ranks disjoint
    ones; the global batch of each step (sorted)."""
    global_batches = []
    for t, ranks in enumerate(by_step(seen)):
        assert sorted(ranks) == list(range(dp_size)), f"step {t}: dp ranks {sorted(ranks)}"
        for dp, batches in ranks.items():
            assert len(batches) == replicas and all(b == batches[0] for b in batches), (
                f"step {t}: the processes of dp rank {dp} got different batches"
            )
        rows = [i for batches in ranks.values() for i in batches[0]]
        assert len(set(rows)) == len(rows), f"step {t}: dp ranks overlap"
        global_batches.append(sorted(rows))
    return global_batches


def check_refusals(differ: list[dict[str, str]]) -> None:
    """Issue 33 items 1-3: each disagreement refused on every process, naming the first
    process that differs and the field."""
    for p in differ:
        for i in range(2):  # process 0 built the two datasets in the other order
            assert "differ on source: global rank 1 (dp=0, tp=1) is the first" in p[f"order{i}"]
            assert "differ on source: rank 1 is the first" in p[f"order_group{i}"]
        assert "differ on dp_dims: global rank 3 (dp=1, tp=1) is the first" in p["dp_dims"]
        assert "differ on mesh shape: global rank 5 (dp=" in p["shape"]
        assert "differ on batch sizes: global rank 2 (dp=1, tp=0) is the first" in p["batch"]
        assert "differ on weights: global rank 4 (dp=2, tp=0) is the first" in p["weights"]


def test_a_2x2_mesh_job_resumes_on_3x2_and_1x2(tmp_path: Path) -> None:
    uri = tmp_path / "rows.lance"
    mesh_job.table(uri, 0, NUM_ROWS)
    mesh_job.table(tmp_path / "web.lance", 0, NUM_ROWS)
    mesh_job.table(tmp_path / "code.lance", 10_000, 10_000 + NUM_ROWS)
    mesh_job.table(tmp_path / "titan.lance", 0, TITAN_ROWS)
    job = {
        "uri": str(uri),
        "web": str(tmp_path / "web.lance"),
        "code": str(tmp_path / "code.lance"),
        "dcp": str(tmp_path / "dcp"),
        "titan": str(tmp_path / "titan.lance"),
        "titan_dcp": str(tmp_path / "titan_dcp"),
        "out": str(tmp_path),
        "agree_s": AGREE_S,
    }
    join_or_fail(mesh_job.run, (free_port(), job), nprocs=6, limit_s=900)
    ranks = [orjson.loads((tmp_path / f"rank{r}.json").read_bytes()) for r in range(6)]

    saved = [ranks[r]["A"] for r in range(4)]
    # A write raced the start-up: process 0 saw the table before it, 1-3 after. One version.
    assert {s["rows"] for s in saved} == {NUM_ROWS}, "a process read the appended rows"
    assert len({s["version"] for s in saved}) == 1
    assert len({s["seed"] for s in saved}) == 1, "shuffle_seed=None: one picked seed"
    assert [s["coords"] for s in saved] == [{"dp": d, "tp": t} for d in range(2) for t in range(2)]
    assert all(s["states_equal"] for s in saved), "any process's state is the job's"
    before = check_replicas(saved, dp_size=2, replicas=2)
    assert len(before) == SAVED_AT

    steps = NUM_ROWS // GLOBAL_BATCH
    on_3x2 = check_replicas([ranks[r]["B"] for r in range(6)], dp_size=3, replicas=2)
    on_1x2 = check_replicas([ranks[r]["C"] for r in range(2)], dp_size=1, replicas=2)
    assert len(on_3x2) == len(on_1x2) == steps - SAVED_AT
    assert on_3x2 == on_1x2, "the same global batch at every step on any dp size"
    for rest in (on_3x2, on_1x2):
        rows = [i for batch in before + rest for i in batch]
        assert sorted(rows) == list(range(NUM_ROWS)), "every row of the saved version once"
    assert {ranks[r]["B"]["version"] for r in range(6)} == {saved[0]["version"]}
    assert {ranks[r]["B"]["seed"] for r in range(6)} == {saved[0]["seed"]}

    refused = [ranks[r]["refused"] for r in range(6)]
    for message in (p["no_group"] for p in refused):
        assert "is not this process's place" in message and "mesh=<DeviceMesh>" in message
        assert "version=<int> and shuffle_seed=<int>" in message
    for p in refused:  # a data-parallel group on a TP mesh: refused on every process
        assert p["dp_group_seed"].startswith("shuffle_seed=None agreed over a process_group of 3")
        assert p["dp_group"].startswith("version=None agreed over a process_group of 3")
        for message in (p["dp_group_seed"], p["dp_group"]):
            assert "shuffle_seed=<int>" in message and "mesh=<DeviceMesh>" in message
    for message in (p["dp_slice"] for p in refused):  # world_mesh["dp"]: every slice refuses
        assert "mesh= has only data-parallel dims ('dp',) and 3 of the job's 6" in message
        assert "Pass the whole mesh (mesh=world_mesh" in message
    for message in (p["rank_not_mesh"] for p in refused):
        assert "contradicts mesh=" in message and "leave rank out" in message

    readers = [ranks[r]["pp"] for r in (0, 1, 4, 5)]  # stages 0 and 2
    check_replicas(readers, dp_size=2, replicas=2)
    for r in (2, 3):
        assert "is not one of the processes that read" in ranks[r]["pp"]["error"]
        assert f"global rank {r} (pp=1, dp={r - 2})" in ranks[r]["pp"]["error"]

    mixed = [ranks[r]["mixture"] for r in range(6)]
    assert [m["coords"] for m in mixed] == [ranks[r]["B"]["coords"] for r in range(6)]
    for batch in check_replicas(mixed, dp_size=3, replicas=2):
        assert sum(i >= 10_000 for i in batch) == GLOBAL_BATCH // 3  # weights 2:1

    # torchtitan's way: saved in the second epoch on (2, 2), resumed on (3, 2): the global
    # batches of an uninterrupted run on one process, every one of one shape.
    titan = check_replicas([ranks[r]["titan_saved"] for r in range(4)], dp_size=2, replicas=2)
    titan += check_replicas([ranks[r]["titan_resumed"] for r in range(6)], dp_size=3, replicas=2)
    alone = iter(TitanDataLoader(titan_dataset(job["titan"]), GLOBAL_BATCH, to_inputs=titan_step))
    expected = [sorted(next(alone)[1].tolist()) for _ in range(TITAN_STEPS)]
    assert titan == expected
    assert all(len(batch) == GLOBAL_BATCH for batch in expected)
    epoch_rows = GLOBAL_BATCH * (TITAN_ROWS // GLOBAL_BATCH)  # the short last step dropped
    first_epoch = [i for batch in expected[: epoch_rows // GLOBAL_BATCH] for i in batch]
    assert len(set(first_epoch)) == epoch_rows  # and then the next epoch, endless

    check_refusals([ranks[r]["differ"] for r in range(6)])
    staged = [ranks[r]["pp_mix"] for r in (0, 1, 4, 5)]  # set_weights on the reading stages
    for t, batch in enumerate(check_replicas(staged, dp_size=2, replicas=2)):
        assert sum(i >= 10_000 for i in batch) == GLOBAL_BATCH // (3 if t < 2 else 2), t
    assert ranks[0]["eval_mix"] == GLOBAL_BATCH  # rank 0 alone: waited for nobody

    for r in range(5):
        message = ranks[r]["missing"]
        assert "global rank 5 (dp=2, tp=1) did not build this dataset" in message, message
