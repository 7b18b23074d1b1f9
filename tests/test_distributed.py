"""Real processes on Gloo: 4 ranks save mid-epoch, 2 ranks resume and save, 1 rank finishes.

Also: at a fresh start every rank reads the version rank 0 saw, even though rank 1 opened
the table after a write landed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch.multiprocessing as mp

from loader import StreamingDataLoader, StreamingDataset
from tests.dist_job import (
    GLOBAL_BATCH,
    NUM_SPLITS,
    build_on_one_rank,
    run_rank,
)
from tests.net import free_port
from tests.tables import lancedb_table

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)


def launch(world: int, job: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    out.mkdir()
    mp.start_processes(
        run_rank,
        args=(world, free_port(), {**job, "out": str(out)}),
        nprocs=world,
        start_method="spawn",
    )
    return [orjson.loads((out / f"rank{r}.json").read_bytes()) for r in range(world)]


def global_batches(ranks: list[dict[str, Any]]) -> list[list[int]]:
    return [
        sorted(i for r in ranks for i in r["batches"][t]) for t in range(len(ranks[0]["batches"]))
    ]


def test_save_on_4_resume_on_2_then_1(tmp_path: Path) -> None:
    db = tmp_path / "db"
    table = lancedb_table(db)
    reference_ds = StreamingDataset(
        table, num_splits=NUM_SPLITS, shuffle_clump_size=3, shuffle_seed=7, rank=0, world_size=1
    )
    reference = [
        sorted(b["id"].tolist()) for b in StreamingDataLoader(reference_ds, batch_size=GLOBAL_BATCH)
    ]

    first = launch(
        4,
        {"db": str(db), "steps": 5, "save": str(tmp_path / "a.json"), "race_append": True},
        tmp_path / "w4",
    )
    assert {r["rows"] for r in first} == {600}, (
        "all ranks read the version rank 0 saw, not the appended one"
    )
    assert all(r["state"] == first[0]["state"] for r in first)
    second = launch(
        2,
        {
            "db": str(db),
            "steps": 4,
            "save": str(tmp_path / "b.json"),
            "resume": str(tmp_path / "a.json"),
        },
        tmp_path / "w2",
    )
    assert {r["rows"] for r in second} == {600}, "the resume reopened the pinned version"
    third = launch(
        1,
        {"db": str(db), "save": str(tmp_path / "c.json"), "resume": str(tmp_path / "b.json")},
        tmp_path / "w1",
    )

    got = global_batches(first) + global_batches(second) + global_batches(third)
    assert got == reference, "the same global batches as one uninterrupted rank"
    rows = [i for batch in got for i in batch]
    assert sorted(rows) == list(range(600)), "every row exactly once across two cuts"
    assert third[0]["state"]["epoch"] == 1 and set(third[0]["state"]["cursors"]) == {0}


def join_or_fail(
    ranks: Callable[..., None], args: tuple[Any, ...], nprocs: int, limit_s: float
) -> None:
    """Run the ranks; a job still running after `limit_s` is killed and fails the test."""
    context = mp.start_processes(ranks, args=args, nprocs=nprocs, start_method="spawn", join=False)
    deadline = time.monotonic() + limit_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {nprocs} ranks still ran after {limit_s:g} s: they hang")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One 2-rank job (`build_on_one_rank`) whose records both tests below read."""
    tmp = tmp_path_factory.mktemp("two_ranks")
    db = tmp / "db"
    lancedb_table(db)
    job = {"db": str(db), "out": str(tmp)}
    join_or_fail(build_on_one_rank, (2, free_port(), job), nprocs=2, limit_s=240)
    return [orjson.loads((tmp / f"rank{r}.json").read_bytes()) for r in range(2)]


def test_a_picked_seed_is_rank_0s_on_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    """shuffle_seed=None: each rank would pick its own seed; they must share rank 0's."""
    ranks = [r["picked"] for r in two_ranks]
    assert ranks[0]["seed"] == ranks[1]["seed"]
    assert not set(ranks[0]["first"]) & set(ranks[1]["first"]), "one plan, disjoint splits"


def test_a_dataset_one_rank_builds_alone_does_not_hang_the_job(
    two_ranks: list[dict[str, Any]],
) -> None:
    """Issue 19.4: an eval dataset built on rank 0 only (rank=0, world_size=1) deadlocked a
    2-rank job (the version broadcast, and the picked seed's, was a collective on the whole
    group). Now it agrees with nobody; a dataset of the whole group still agrees on rank 0's
    version and seed; one that a rank builds alone by mistake fails in time, saying what to pass."""
    ranks = two_ranks
    assert ranks[0]["alone"] == [600, 6]
    assert ranks[0]["rows"] == ranks[1]["rows"] == 600, "rank 0's version, not rank 1's newer one"
    assert ranks[0]["version"] == ranks[1]["version"]
    assert ranks[0]["seed"] == ranks[1]["seed"]
    message = ranks[0]["timeout"]
    assert "did not agree on the table version within 3 s" in message, message
    assert "$ELASTIC_LOADER_AGREE_TIMEOUT_S sets the limit" in message
    assert "needs rank=0, world_size=1 (or process_group=False)" in message
    assert "version=<int>" in message
