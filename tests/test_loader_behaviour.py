"""Workers, processes, epochs, transforms and errors of the loader, on a real LanceDB table."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
import torch

from loader import StreamingDataLoader, StreamingDataset
from loader.read import convert
from loader.read.reader import BatchReader
from loader.sources.lance import LanceRows
from tests.batches import ids
from tests.test_worker_faults import run_script


def batches(
    table: Any, rank: int = 0, world: int = 1, batch: int = 32, **kw: Any
) -> list[list[int]]:
    ds = StreamingDataset(table, num_splits=4, shuffle_clump_size=5, rank=rank, world_size=world)
    return ids(StreamingDataLoader(ds, batch_size=batch, **kw))


def flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


@pytest.mark.parametrize(
    "kw",
    [
        {"reads_in_flight": 0},
        {"reads_in_flight": 1},
        {"reads_in_flight": 2},
        {"reads_in_flight": 8},
        {"num_workers": 2, "reads_in_flight": 3, "read_size": 3000},
        {"read_size": 1},
        {"num_workers": 2, "read_size": 100},
        {"num_workers": 1},
        {"num_workers": 2},
        {"num_workers": 4, "prefetch_factor": 1},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 2, "pin_memory": True},
        {"num_workers": 2, "drop_last": True},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
@pytest.mark.slow
def test_workers_change_nothing(lance_rows: Any, kw: dict[str, Any]) -> None:
    drop_last = kw.get("drop_last", False)
    expected = batches(lance_rows, rank=1, world=2, drop_last=drop_last)
    assert batches(lance_rows, rank=1, world=2, **kw) == expected
    assert drop_last or sum(len(b) for b in expected) == 300


@pytest.mark.slow
def test_persistent_workers_across_epochs_and_a_resume(lance_rows: Any) -> None:
    ds = StreamingDataset(lance_rows, num_splits=4, rank=0, world_size=1)
    dl = StreamingDataLoader(ds, batch_size=50, num_workers=2, persistent_workers=True)
    epoch0 = ids(dl)
    epoch1 = ids(dl)  # a new `for` after a full epoch is the next epoch
    assert sorted(flat(epoch0)) == sorted(flat(epoch1)) == list(range(600))
    assert epoch0 != epoch1
    head = ids(itertools.islice(dl, 3))
    state = dl.state_dict()
    assert state["epoch"] == 2 and sum(state["cursors"]) == 150 and state["step"] == 3
    assert (dl.step, len(dl)) == (3, 12), "len counts the whole epoch, step the batches so far"
    rest = ids(dl)  # a new `for` continues where the last one stopped
    assert sorted(flat(head + rest)) == list(range(600))
    # a finished epoch: the next one has not started; step is still the batch in hand's
    assert (dl.step, len(dl)) == (12, 12) and dl.state_dict()["step"] == 0
    dl.load_state_dict(state)
    assert (dl.step, len(dl)) == (3, 12), "a resume keeps counting the epoch's batches"
    assert ids(dl) == rest


# How a worker forked from a parent that ran Lance fails when Lance's hazard strikes
# (README, "Worker processes and fork"): it dies of a signal, or hangs until data_timeout_s.
FORK_HAZARD = ("DataLoader worker (pid(s) ", "DataWaitTimeout: ")
LANCE_FORK_WARNING = "lance is not fork-safe"


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver", None])  # None: the default
@pytest.mark.slow
def test_workers_under_every_start_method_after_the_parent_used_the_table(
    lance_rows: Any, context: str | None, tmp_path: Path
) -> None:
    """A training script that opened and read the table, then starts workers: same batches.

    Run as its own script, as a user runs it: the parent is the script, not this pytest
    process. Forkserver and spawn never fork a process that ran Lance: they always work.
    A plain fork copies whatever Lance's threads were doing; a few forks in a hundred crash
    or hang their worker (README), and then the loop must say so (torch's "exited
    unexpectedly", or `DataWaitTimeout` for a hang), never hand out other batches. Lance's
    "not fork-safe" warning shows under fork only: the forkserver never ran Lance."""
    root = Path(lance_rows.to_lance().uri).parent
    out = tmp_path / "batches.json"
    hang_s = 20 if context == "fork" else 600  # a forked worker's hang fails within the test
    done = run_script(
        tmp_path / "train.py",
        f"""
        import lancedb, orjson
        from tests.test_loader_behaviour import batches

        if __name__ == "__main__":
            table = lancedb.connect({str(root)!r}).open_table({lance_rows.name!r})
            table.to_arrow()  # the parent has the table open and has read it
            expected = batches(table, batch=100)
            got = batches(
                table, batch=100, num_workers=2, multiprocessing_context={context!r},
                data_timeout_s={hang_s},
            )
            open({str(out)!r}, "wb").write(orjson.dumps([expected, got]))
        """,
    )
    # Lance's warning only where it applies: a fork of the process that ran Lance (#33 item 19)
    assert (LANCE_FORK_WARNING in done.stderr) == (context == "fork"), done.stderr[-3000:]
    if context == "fork" and done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1]
        assert any(h in last for h in FORK_HAZARD), done.stderr[-3000:]
        assert not out.exists()
        return
    assert done.returncode == 0, done.stderr[-3000:]
    expected, got = orjson.loads(out.read_bytes())
    assert got == expected and sorted(flat(got)) == list(range(600))


def test_set_epoch_and_state_after_the_last_batch(lance_rows: Any) -> None:
    ds = StreamingDataset(lance_rows, num_splits=4, epoch=3)
    dl = StreamingDataLoader(ds, batch_size=64, drop_last=True)
    assert len(dl) == 600 // 64
    assert len(list(dl)) == 9
    state = dl.state_dict()
    assert state["epoch"] == 4 and set(state["cursors"]) == {0}
    ds.set_epoch(4)  # already there: no reset
    assert dl.state_dict() == state
    ds.set_epoch(1)
    assert dl.state_dict()["epoch"] == 1
    fresh = StreamingDataset(lance_rows, num_splits=4, epoch=1)
    assert ids(dl) == ids(StreamingDataLoader(fresh, batch_size=64, drop_last=True))


def test_rows_of_the_dataset_and_its_state(lance_rows: Any) -> None:
    """Row-level iteration: three ranks read 70 rows each, any one's state resumes all on W=1."""
    ranks = [
        StreamingDataset(lance_rows, num_splits=6, columns=["id", "name"], rank=r, world_size=3)
        for r in range(3)
    ]
    assert [len(ds) for ds in ranks] == [200] * 3
    heads = [list(itertools.islice(ds, 70)) for ds in ranks]
    assert set(heads[0][0]) == {"id", "name"}
    states = [ds.state_dict() for ds in ranks]
    assert states[0] == states[1] == states[2]
    again = StreamingDataset(lance_rows, num_splits=6, columns=["id", "name"], rank=0, world_size=1)
    again.load_state_dict(states[2])
    seen = [r["id"] for head in heads for r in head] + [r["id"] for r in again]
    assert sorted(seen) == list(range(600))


def test_default_path_reads_whole_batches_without_per_row_python(
    lance_rows: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism behind the speed: one sorted `take` per read, no per-row Python."""
    takes: list[int] = []
    converted: list[Any] = []
    original, to_numpy = LanceRows.take, convert.column_to_numpy

    def counting_take(self: LanceRows, positions: Any) -> pa.Table:
        takes.append(len(positions))
        assert (positions[1:] > positions[:-1]).all(), "reads are in ascending position order"
        return original(self, positions)

    def no_rows(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("per-row Python on the default path")

    monkeypatch.setattr(LanceRows, "take", counting_take)
    monkeypatch.setattr(BatchReader, "_rows_through_transform", no_rows)
    monkeypatch.setattr(
        convert, "column_to_numpy", lambda arr: converted.append(arr.type) or to_numpy(arr)
    )
    ds = StreamingDataset(
        lance_rows, columns=["id", "x", "label"], num_splits=4, shuffle_clump_size=16
    )
    got = list(StreamingDataLoader(ds, batch_size=128, read_size=256))
    assert [len(b["id"]) for b in got] == [128] * 4 + [88]
    assert sorted(takes) == [88, 256, 256], "one sorted read per two batches (run at once)"
    assert len(converted) == 3 * 3, "every column of every read went through NumPy"
    assert got[0]["x"].dtype == torch.float32 and got[0]["x"].shape == (128, 4)
    assert got[0]["id"].dtype == torch.int64


def test_transforms_and_on_error(lance_rows: Any) -> None:
    def odd_only(row: dict[str, Any]) -> dict[str, Any]:
        if row["id"] % 2 == 0:
            raise ValueError("even")
        return {"id": row["id"], "double": row["id"] * 2}

    ds = StreamingDataset(lance_rows, num_splits=2, transform=odd_only, on_error="skip")
    got = list(StreamingDataLoader(ds, batch_size=100))
    ids = torch.cat([b["id"] for b in got])
    assert sorted(ids.tolist()) == list(range(1, 600, 2))
    assert torch.equal(torch.cat([b["double"] for b in got]), ids * 2)
    with pytest.warns(UserWarning, match="transform failed"):
        list(
            itertools.islice(
                StreamingDataset(lance_rows, num_splits=2, transform=odd_only, on_error="warn"), 3
            )
        )
    with pytest.raises(ValueError, match="even"):
        list(StreamingDataset(lance_rows, num_splits=2, transform=odd_only))
    scaled = StreamingDataLoader(
        StreamingDataset(lance_rows, num_splits=2),
        batch_size=10,
        batch_transform=lambda b: b["id"] * 10,
    )
    assert sorted(torch.cat(list(scaled)).tolist()) == list(range(0, 6000, 10))


def test_bad_input_gets_clear_errors(lance_rows: Any, arrow_rows: pa.Table) -> None:
    four_of_six = StreamingDataset(lance_rows, num_splits=6, rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"multiple of num_splits.*world sizes \[1, 2, 3, 6\]"):
        StreamingDataLoader(four_of_six, batch_size=2)  # G = 8: not a multiple of S = 6
    with pytest.raises(ValueError, match=r"world_size=4 to divide num_splits=6"):
        next(iter(four_of_six))  # row by row: W must divide S
    assert len(StreamingDataLoader(four_of_six, global_batch_size=12)) == 50
    with pytest.raises(ValueError, match="smaller than num_splits=8"):
        StreamingDataset(lance_rows, num_splits=8, filter="id < 5")
    with pytest.raises(ValueError, match=r"unknown columns \['nope'\].*available columns"):
        StreamingDataset(lance_rows, num_splits=2, columns=["id", "nope"])
    with pytest.raises(ValueError, match="filter 'no_such_column > 3' failed"):
        StreamingDataset(lance_rows, num_splits=2, filter="no_such_column > 3")
    with pytest.raises(ValueError, match=r"rank should be in the interval \[0, 1\]"):
        StreamingDataset(lance_rows, num_splits=2, rank=2, world_size=2)
    with pytest.raises(TypeError, match=r"pyarrow\.compute Expression"):
        StreamingDataset(arrow_rows, num_splits=2, filter="id < 3")
    with pytest.warns(UserWarning, match="num_splits not set"):
        StreamingDataset(lance_rows)
    with pytest.raises(ValueError, match="decided by the plan"):
        StreamingDataLoader(StreamingDataset(lance_rows, num_splits=2), sampler=[0, 1])


@pytest.mark.parametrize(
    ("field", "kw"),
    [
        ("num_splits", {"num_splits": 6}),
        ("shuffle_seed", {"shuffle_seed": 1}),
        ("shuffle_clump_size", {"shuffle_clump_size": 8}),
        ("filter", {"filter": "id < 500"}),
        ("shuffle", {"shuffle": False}),
    ],
)
def test_a_state_from_another_plan_names_the_field(
    lance_rows: Any, field: str, kw: dict[str, Any]
) -> None:
    base = {"num_splits": 4, "shuffle_seed": 0, "shuffle_clump_size": 4}
    saved = StreamingDataLoader(StreamingDataset(lance_rows, **base), batch_size=8)
    next(iter(saved))
    other = StreamingDataLoader(StreamingDataset(lance_rows, **{**base, **kw}), batch_size=8)
    with pytest.raises(ValueError, match=rf"plan\.{field}="):
        other.load_state_dict(saved.state_dict())


def test_a_state_with_bad_cursors_or_format_is_refused(lance_rows: Any) -> None:
    dl = StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), batch_size=8)
    good = dl.state_dict()
    for broken, message in [
        ({**good, "cursors": [0, 0, 0]}, "3 cursors, expected num_splits=4"),
        ({**good, "cursors": [0, -1, 0, 0]}, "cursor of split 1 is -1"),
        ({**good, "format_version": 99}, "format_version 99"),
        ({"cursors": []}, "missing fields"),
        ({**good, "plan": {**good["plan"], "drop_last": True}}, r"plan\.drop_last"),
    ]:
        with pytest.raises(ValueError, match=message):
            dl.load_state_dict(broken)


@pytest.mark.slow
def test_lance_dataset_and_paths_are_sources_too(lance_rows: Any, parquet_rows: Any) -> None:
    import pickle

    import lance
    import pyarrow.dataset as pads

    expected = batches(lance_rows, batch=100)
    uri = lance_rows.to_lance().uri
    assert batches(lance.dataset(uri), batch=100) == expected
    assert batches(uri, batch=100) == expected
    by_path = batches(str(parquet_rows), batch=100)
    assert batches(pads.dataset(str(parquet_rows), format="parquet"), batch=100) == by_path
    assert sorted(flat(by_path)) == list(range(600))
    ds = StreamingDataset(lance_rows, num_splits=4)
    copy = pickle.loads(pickle.dumps(ds))  # plain DataLoader workers under spawn pickle it
    assert [r["id"] for r in copy] == [r["id"] for r in ds]


def test_resume_reads_only_what_is_left(lance_rows: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resuming at 90 % of the epoch reads the rest and nothing before it: no replay."""
    saved = StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), batch_size=60)
    head = flat(ids(itertools.islice(saved, 9)))
    takes: list[int] = []
    original = LanceRows.take

    def counting_take(self: LanceRows, positions: Any) -> pa.Table:
        takes.append(len(positions))
        return original(self, positions)

    monkeypatch.setattr(LanceRows, "take", counting_take)
    resumed = StreamingDataLoader(
        StreamingDataset(lance_rows, num_splits=4, rank=1, world_size=2), batch_size=30
    )
    resumed.load_state_dict(saved.state_dict())
    rest = flat(ids(resumed))
    assert takes == [30], "one read of the 30 rows left to this rank, nothing replayed"
    assert len(rest) == 30 and not set(rest) & set(head)
