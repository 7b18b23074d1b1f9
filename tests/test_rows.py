"""`loader.rows_at_step` and `elastic-loader rows`: the rows of global step T, and which
rank read each, equal what real loaders yield at step T — from a checkpoint (its future,
the earlier steps of its epoch, the next epoch) and from plan arguments (issue 19)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from loader import (
    PlanSpec,
    RunPosition,
    StreamingDataLoader,
    StreamingDataset,
    checkpoint,
    rows_at_step,
)
from loader.stream import Batching
from loader.tools import cli

N, S, SEED = 2400, 8, 5


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`id` = 10 × the table position, so ids and positions are told apart."""
    db = lancedb.connect(str(tmp_path_factory.mktemp("rows")))
    return db.create_table("t", pa.table({"id": np.arange(N, dtype=np.int64) * 10}))


def _loaders(table: Any, world: int, filter: str | None = None, **batching: int) -> list[Any]:
    return [
        StreamingDataLoader(
            StreamingDataset(table, ["id"], filter, S, shuffle_seed=SEED, rank=r, world_size=world),
            **batching,
        )
        for r in range(world)
    ]


def _two_epochs(loaders: list[Any], first: int) -> tuple[dict[str, Any], list[list[int]]]:
    """Global steps of epochs 0 and 1, each as rank 0's ids then rank 1's ...; and the state
    after `first` steps (all ranks' states are the same)."""
    its = [iter(dl) for dl in loaders]
    steps = [[b["id"].tolist() for b in (next(it) for _ in range(first))] for it in its]
    state = loaders[0].state_dict()
    for r, it in enumerate(its):
        steps[r] += [b["id"].tolist() for b in it]
    for r, dl in enumerate(loaders):
        steps[r] += [b["id"].tolist() for b in dl]  # epoch 1
    return state, [[i for part in batch for i in part] for batch in zip(*steps, strict=True)]


LAYOUTS = {
    "W=3, S=8, G=240 (ranks share splits 2 and 5)": (3, {"global_batch_size": 240}),
    "W=4 divides S=8, G=120": (4, {"global_batch_size": 120}),
    "W=2 divides S=8, G=10 (the split layout)": (2, {"batch_size": 5}),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_step_equals_what_the_loaders_yield(table: Any, name: str) -> None:
    world, batching = LAYOUTS[name]
    state, steps = _two_epochs(_loaders(table, world, **batching), first=4)
    run = RunPosition.from_state(state)
    assert (run.world_size, run.global_step, run.step) == (world, 4, 4)
    for t, ids in enumerate(steps):  # before the state, after it, and into epoch 1
        found = rows_at_step(run, t, id_column="id")
        assert found.ids == ids, t
        assert (found.positions * 10).tolist() == ids  # no filter: plan = table positions
        half = len(steps) // 2
        assert (found.epoch, found.epoch_step) == (t // half, t % half)
    # From the plan arguments alone: the same steps, without a checkpoint.
    g = (
        world * batching["batch_size"]
        if "batch_size" in batching
        else batching["global_batch_size"]
    )
    plan = RunPosition(PlanSpec(N, S, True, SEED), world, Batching(None, False, g))
    assert all((rows_at_step(plan, t).positions * 10).tolist() == steps[t] for t in (0, 7, 13))


def test_which_rank_read_each_row(table: Any) -> None:
    loaders = _loaders(table, 3, global_batch_size=240)
    batches = [next(iter(dl))["id"].tolist() for dl in loaders]
    run = RunPosition.from_state(loaders[0].state_dict())
    found = rows_at_step(run, 0, id_column="id")
    for r in range(3):
        assert [i for i, k in zip(found.ids or [], found.ranks, strict=True) if k == r] == batches[
            r
        ]
    assert rows_at_step(run, 0, rank=1, id_column="id").ids == batches[1]
    assert len(batches[0]) == len(batches[1]) == len(batches[2]) == 80


def test_a_filtered_plan_maps_to_table_positions(table: Any) -> None:
    loaders = _loaders(table, 3, filter="id % 30 != 0", global_batch_size=240)
    batch = next(iter(loaders[2]))["id"].tolist()
    run = RunPosition.from_state(loaders[2].state_dict())
    assert run.filter == "id % 30 != 0" and run.spec.num_rows == 1600
    found = rows_at_step(run, 0, rank=2)  # the filter is evaluated: the source is opened
    assert found.table_positions is not None
    assert (found.table_positions * 10).tolist() == batch
    assert found.positions.max() < 1600  # plan positions index the filtered rows


def test_steps_it_cannot_answer_say_why(table: Any) -> None:
    loaders = _loaders(table, 3, global_batch_size=240)
    state, _ = _two_epochs(loaders, first=4)
    later = {**state, "epoch": 1, "cursors": [30] * S, "step": 1, "global_step": 11}
    with pytest.raises(ValueError, match="before epoch 1, which began at global step 10"):
        rows_at_step(RunPosition.from_state(later), 9)
    changed = {**state, "cursors": [60] * S}  # 4 steps of 240 rows lead to 120 a split
    with pytest.raises(ValueError, match=r"global batch changed.*steps from 4 on can"):
        rows_at_step(RunPosition.from_state(changed), 1)
    rows_at_step(RunPosition.from_state(changed), 4)  # its future is known
    four = _loaders(table, 4, batch_size=30)[0].state_dict()
    old = {k: v for k, v in four.items() if k != "global_batch_size"}  # written before it
    with pytest.raises(ValueError, match=r"no global_batch_size.*--global-batch"):
        RunPosition.from_state(old)
    assert RunPosition.from_state(old, 120).batching.global_batch == 120
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\]"):
        rows_at_step(RunPosition.from_state(state), 0, rank=3)


def test_the_cli_from_a_checkpoint_and_from_plan_arguments(
    table: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaders = _loaders(table, 3, global_batch_size=240)
    state, steps = _two_epochs(loaders, first=4)
    saved = checkpoint.save(state, tmp_path / "ckpt")
    assert cli.main(["rows", str(tmp_path / "ckpt"), "--step", "6", "--id-column", "id"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# global step 6: epoch 0, step 6 of the epoch; W = 3, G = 240; 240 rows"
    assert out[1] == "rank\tposition\tid"  # the id column by its name
    assert [int(line.split("\t")[2]) for line in out[2:]] == steps[6]
    assert cli.main(["rows", str(saved), "--step", "12", "--rank", "0", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["epoch"], answer["epoch_step"], len(answer["rows"])) == (1, 2, 80)
    assert [10 * r["position"] for r in answer["rows"]] == steps[12][:80]
    plan = ["rows", "plan", "--step", "12", "--rows", str(N), "--num-splits", str(S)]
    plan += ["--seed", str(SEED), "--world-size", "3", "--global-batch", "240"]
    assert cli.main(plan) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    assert [10 * int(line.split("\t")[1]) for line in lines] == steps[12]
    with_ids = [*plan, "--rank", "2", "--id-column", "id", "--source", table.to_lance().uri]
    assert cli.main(with_ids) == 0  # the plan's rows, read from the table given
    lines = capsys.readouterr().out.splitlines()[2:]
    assert [int(line.split("\t")[2]) for line in lines] == steps[12][160:]
    assert cli.main(plan[:-2]) == 2
    assert "`plan` needs --global-batch" in capsys.readouterr().err
    assert cli.main(["rows", str(tmp_path / "none.json"), "--step", "1"]) == 2
    assert "elastic-loader rows: error:" in capsys.readouterr().err


def test_after_a_resize_the_steps_before_it_are_the_same_rows(table: Any) -> None:
    """4 ranks for 3 steps, then 3 ranks at the same G = 240: from the later state, the
    earlier steps of the epoch are the same rows (their ranks are the state's W's), the
    later ones exactly what the 3 ranks read."""
    four = _loaders(table, 4, global_batch_size=240)
    its = [iter(dl) for dl in four]
    before = [sorted(i for it in its for i in next(it)["id"].tolist()) for _ in range(3)]
    three = _loaders(table, 3, global_batch_size=240)
    for dl in three:
        dl.load_state_dict(four[0].state_dict())
    its = [iter(dl) for dl in three]
    after = [[i for it in its for i in next(it)["id"].tolist()] for _ in range(2)]
    run = RunPosition.from_state(three[0].state_dict())
    assert (run.world_size, run.global_step, run.step) == (3, 5, 5)
    for t in range(3):
        assert sorted(rows_at_step(run, t, id_column="id").ids or []) == before[t]
    for t in range(2):
        assert rows_at_step(run, 3 + t, id_column="id").ids == after[t]
