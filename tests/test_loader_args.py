"""Constructor arguments are checked at construction; each error names the argument,
the value and the accepted range (issue #10 item 20), and what agrees with the plan from
torch/LitData code is accepted (the peers' section)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from loader import StreamingDataLoader, StreamingDataset
from tests.tables import make_rows

SEED_RANGE = r"shuffle_seed must be an integer \[0, 18446744073709551616\)"


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"num_splits": 4.0}, TypeError, r"num_splits must be an integer >= 1, got 4\.0 \(float\)"),
        ({"num_splits": 0}, ValueError, r"num_splits must be an integer >= 1, got 0"),
        (
            {"shuffle_clump_size": 0},
            ValueError,
            r"shuffle_clump_size must be an integer >= 1, got 0",
        ),
        (
            {"shuffle_clump_size": -3},
            ValueError,
            r"shuffle_clump_size must be an integer >= 1, got -3",
        ),
        ({"shuffle_clump_size": 2.5}, TypeError, r"shuffle_clump_size must be an integer >= 1"),
        ({"shuffle_seed": 2**64 + 5}, ValueError, SEED_RANGE + ", got 18446744073709551621"),
        ({"shuffle_seed": 10**30}, ValueError, SEED_RANGE),
        ({"shuffle_seed": -1}, ValueError, SEED_RANGE),
        ({"shuffle_seed": "7"}, TypeError, SEED_RANGE + r", got '7' \(str\)"),
        ({"shuffle": "no"}, TypeError, r"shuffle must be True or False, got 'no' \(str\)"),
        ({"epoch": -1}, ValueError, r"epoch must be an integer >= 0, got -1"),
        ({"epoch": 1.5}, TypeError, r"epoch must be an integer >= 0"),
        ({"rank": 0.0, "world_size": 1}, TypeError, r"rank must be an integer >= 0"),
        ({"world_size": 2.0}, TypeError, r"world_size must be an integer >= 1"),
        ({"columns": "id"}, TypeError, r"columns must be a list of column names"),
        ({"transform": 3}, TypeError, r"transform must be a function or None, got 3 \(int\)"),
        ({"on_error": "ignore"}, ValueError, r"on_error='ignore'; expected one of"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_dataset_arguments_are_checked_naming_them(
    arrow_rows: Any, kw: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        StreamingDataset(arrow_rows, **{"num_splits": 2, **kw})


def test_source_none_says_what_a_source_is() -> None:
    with pytest.raises(ValueError, match="source is None; pass a LanceDB table"):
        StreamingDataset(None, num_splits=2)


def test_the_largest_seed_is_accepted_and_saved(arrow_rows: Any) -> None:
    ds = StreamingDataset(arrow_rows, num_splits=2, shuffle_seed=2**64 - 1)
    dl = StreamingDataLoader(ds, batch_size=64)
    next(iter(dl))
    assert dl.state_dict()["plan"]["shuffle_seed"] == 2**64 - 1
    assert StreamingDataset(arrow_rows, num_splits=np.int64(2)).num_splits == 2


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        (
            {"batch_size": 32.0},
            TypeError,
            r"batch_size must be an integer >= 1, got 32\.0 \(float\)",
        ),
        ({"batch_size": 0}, ValueError, r"batch_size must be an integer >= 1, got 0"),
        ({"batch_size": None}, TypeError, r"batch_size must be an integer >= 1, got None"),
        ({"num_workers": -1}, ValueError, r"num_workers must be an integer >= 0, got -1"),
        ({"num_workers": 1.0}, TypeError, r"num_workers must be an integer >= 0"),
        ({"drop_last": 1}, TypeError, r"drop_last must be True or False, got 1 \(int\)"),
        ({"read_size": 0}, ValueError, r"read_size must be an integer >= 1, got 0"),
        ({"reads_in_flight": -1}, ValueError, r"reads_in_flight must be an integer >= 0, got -1"),
        ({"data_timeout_s": 0}, ValueError, r"data_timeout_s must be a positive number"),
        ({"data_timeout_s": "10"}, TypeError, r"data_timeout_s must be a positive number"),
        ({"batch_transform": "f"}, TypeError, r"batch_transform must be a function or None"),
        ({"sampler": [0, 1]}, ValueError, r"\['sampler'\] are decided by the plan"),
        ({"batch_sampler": [[0]]}, ValueError, r"\['batch_sampler'\] are decided by the plan"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_loader_arguments_are_checked_naming_them(
    arrow_rows: Any, kw: dict[str, Any], error: type[Exception], message: str
) -> None:
    ds = StreamingDataset(arrow_rows, num_splits=2)
    with pytest.raises(error, match=message):
        StreamingDataLoader(ds, **kw)


def test_litdata_style_arguments_that_agree_with_the_plan_are_accepted(arrow_rows: Any) -> None:
    """`StreamingDataLoader(ds, batch_size=..., shuffle=True)` as LitData code writes it."""
    shuffled = StreamingDataset(arrow_rows, num_splits=2)
    expected = [b["id"].tolist() for b in StreamingDataLoader(shuffled, batch_size=100)]
    as_litdata = StreamingDataLoader(
        StreamingDataset(arrow_rows, num_splits=2), batch_size=100, shuffle=True, sampler=None
    )
    assert [b["id"].tolist() for b in as_litdata] == expected
    ordered = StreamingDataset(arrow_rows, num_splits=2, shuffle=False)
    assert len(StreamingDataLoader(ordered, batch_size=100, shuffle=False, in_order=True)) == 6


def test_errors_about_read_ahead_name_read_ahead(arrow_rows: Any) -> None:
    """Issue 19.15: `read_size=0, read_ahead=-5` was refused naming reads_in_flight, an
    argument the user did not write."""
    ds = StreamingDataset(arrow_rows, num_splits=2)
    with (
        pytest.warns(DeprecationWarning, match="read_ahead is now reads_in_flight"),
        pytest.raises(ValueError, match=r"^read_ahead must be an integer >= 0, got -5$"),
    ):
        StreamingDataLoader(ds, read_size=0, read_ahead=-5)
    with pytest.raises(ValueError, match=r"read_ahead=2 and reads_in_flight=3 were both given"):
        StreamingDataLoader(ds, read_ahead=2, reads_in_flight=3)
    with pytest.warns(DeprecationWarning):
        assert StreamingDataLoader(ds, read_ahead=3).reads_in_flight == 3


def _ids(loader: StreamingDataLoader) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


def test_the_loaders_shuffle_turns_shuffling_on_or_off_before_reading(arrow_rows: Any) -> None:
    """Issue 19: LitData's `StreamingDataLoader(ds, shuffle=True)` over a dataset built
    without shuffling was refused; LitData turns shuffling on (keeping the dataset's seed)."""
    shuffled = _ids(
        StreamingDataLoader(
            StreamingDataset(arrow_rows, num_splits=2, shuffle_seed=7), batch_size=100
        )
    )
    ordered = _ids(
        StreamingDataLoader(
            StreamingDataset(arrow_rows, num_splits=2, shuffle=False), batch_size=100
        )
    )
    assert shuffled != ordered
    ds = StreamingDataset(arrow_rows, num_splits=2, shuffle=False, shuffle_seed=7)
    with pytest.raises(ValueError, match="batch_size"):
        StreamingDataLoader(ds, batch_size=0, shuffle=True)
    assert not ds.plan.shuffle, "a construction that failed changed nothing"
    dl = StreamingDataLoader(ds, batch_size=100, shuffle=True)
    assert ds.plan.shuffle and ds.shuffle_seed == 7
    assert _ids(dl) == shuffled
    assert dl.state_dict()["plan"]["shuffle"] is True  # the state says what was read
    off = StreamingDataLoader(
        StreamingDataset(arrow_rows, num_splits=2), batch_size=100, shuffle=False
    )
    assert _ids(off) == ordered and off.state_dict()["plan"]["shuffle"] is False


def test_the_loaders_shuffle_replans_packed_data_too() -> None:
    docs = pa.table(
        {"tokens": pa.array([[i] * (i % 5 + 1) for i in range(60)], pa.list_(pa.int32()))}
    )
    kw: dict[str, Any] = {"columns": ["tokens"], "num_splits": 2, "pack_sequences": 4, "eos_id": -1}
    shuffled = StreamingDataLoader(StreamingDataset(docs, **kw), batch_size=2)
    ordered = StreamingDataset(docs, shuffle=False, **kw)
    replanned = StreamingDataLoader(ordered, batch_size=2, shuffle=True)
    assert ordered.packing is not None and ordered.packing.plan.shuffle
    want = [b["input_ids"].tolist() for b in shuffled]
    assert [b["input_ids"].tolist() for b in replanned] == want


def test_the_loaders_shuffle_is_refused_once_reading_started(arrow_rows: Any) -> None:
    ds = StreamingDataset(arrow_rows, num_splits=2, shuffle=False)
    first = StreamingDataLoader(ds, batch_size=100)
    next(iter(first))
    state = first.state_dict()
    with pytest.raises(
        ValueError,
        match=r"shuffle=True contradicts the dataset, built with "
        r"shuffle=False, and rows have already been read",
    ):
        StreamingDataLoader(ds, batch_size=100, shuffle=True)
    assert not ds.plan.shuffle
    fresh = StreamingDataset(arrow_rows, num_splits=2, shuffle=False)
    fresh.load_state_dict({**state, "cursors": [0, 0], "step": 0, "global_step": 0})
    with pytest.raises(ValueError, match="or a state loaded"):
        StreamingDataLoader(fresh, batch_size=100, shuffle=True)


def test_process_group_is_checked_naming_it(
    arrow_rows: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"process_group='g': expected a torch.distributed"):
        StreamingDataset(arrow_rows, num_splits=2, process_group="g")
    alone = StreamingDataset(arrow_rows, num_splits=2, process_group=False, shuffle_seed=None)
    assert alone.num_rows == 600  # no group, one rank: nothing to agree on
    with pytest.raises(ValueError, match=r"or process_group=False\); pass shuffle_seed=<int>"):
        StreamingDataset(arrow_rows, num_splits=2, rank=0, world_size=2, shuffle_seed=None)
    from loader.world import agree_timeout_s

    assert agree_timeout_s() == 300
    monkeypatch.setenv("ELASTIC_LOADER_AGREE_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match=r"ELASTIC_LOADER_AGREE_TIMEOUT_S='soon': expected a"):
        agree_timeout_s()


@pytest.mark.parametrize("g", [2**63, 2**64])
def test_a_global_batch_the_state_cannot_hold_is_refused_at_construction(g: int) -> None:
    """Issue 24 item 10: G of 2**63 or 2**64 constructed and trained, then its own
    state_dict() could be neither saved nor loaded."""
    ds = StreamingDataset(make_rows(0, 40), num_splits=4)
    with pytest.raises(ValueError, match=r"global_batch_size=\d+ makes .* below 2\*\*63"):
        StreamingDataLoader(ds, global_batch_size=g)
    two = StreamingDataset(make_rows(0, 40), num_splits=4, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"batch_size=\d+ on world_size=2 makes .* below 2\*\*63"):
        StreamingDataLoader(two, batch_size=g // 2)
    top = StreamingDataLoader(ds, global_batch_size=2**63 - 4)  # the largest that fits S=4
    state = top.state_dict()
    assert state["global_batch_size"] == 2**63 - 4
    StreamingDataLoader(ds, global_batch_size=2**63 - 4).load_state_dict(state)


def test_one_checker_for_the_public_surface(tmp_path: Any) -> None:
    """Issue 24 item 12: rows_at_step(rank=1.5) mixed ranks 1 and 2, rank=True answered as
    rank 1, and numpy integers or numpy weights were refused though accepted elsewhere."""
    from loader import (
        MixedDataset,
        RunPosition,
        check_world_size,
        owned_splits,
        rows_at_step,
        supported_world_sizes,
    )

    ds = StreamingDataset(make_rows(0, 64), num_splits=4, rank=0, world_size=2)
    state = StreamingDataLoader(ds, global_batch_size=8).state_dict()
    run = RunPosition.from_state(state)
    for bad in (1.5, True, np.float64(1.0), np.bool_(True)):
        with pytest.raises(TypeError, match=r"rank must be an integer >= 0, got"):
            rows_at_step(run, 3, rank=bad)
        with pytest.raises(TypeError, match=r"step must be an integer >= 0, got"):
            rows_at_step(run, bad, rank=1)
        with pytest.raises(TypeError, match=r"rank must be an integer"):
            owned_splits(bad, 2, 4)
        with pytest.raises(TypeError, match=r"world_size must be an integer"):
            check_world_size(4, bad)
    wide = rows_at_step(run, np.int64(3), rank=np.int32(1))
    assert wide.positions.tolist() == rows_at_step(run, 3, rank=1).positions.tolist()
    assert supported_world_sizes(np.int64(12)) == supported_world_sizes(12)
    a = StreamingDataset(make_rows(0, 40), num_splits=2)
    b = StreamingDataset(make_rows(100, 140), num_splits=2)
    for weights in ([np.int64(3), np.int64(1)], [np.float32(0.75), np.float32(0.25)]):
        assert MixedDataset([a, b], weights).weights == [0.75, 0.25]
    for bad_weight in (True, "1", np.bool_(False)):
        with pytest.raises(TypeError, match=r"weights\[0\] must be a number >= 0"):
            MixedDataset([a, b], [bad_weight, 1])


def _ids_plus_one(batch: dict[str, Any]) -> dict[str, Any]:
    return {"id": batch["id"] + 1}


def _as_tuple(batch: dict[str, Any]) -> tuple[Any, int]:
    return batch["id"], len(batch["id"])


def test_collate_fn_applies_to_the_loaders_batches() -> None:
    """Issue 24 item 13: collate_fn was accepted and silently ignored. It runs on each batch
    the loader made (after batch_transform), in the process that reads (picklable for workers)."""
    import pickle

    ds = StreamingDataset(make_rows(0, 40), columns=["id"], num_splits=2, shuffle=False)
    plain = [b["id"].tolist() for b in StreamingDataLoader(ds, batch_size=8)]
    dl = StreamingDataLoader(ds, batch_size=8, collate_fn=_as_tuple)
    got = list(dl)
    assert [(ids.tolist(), n) for ids, n in got] == [(ids, len(ids)) for ids in plain]
    both = StreamingDataLoader(
        ds, batch_size=8, batch_transform=_ids_plus_one, collate_fn=_as_tuple
    )
    assert [ids.tolist() for ids, _ in both] == [[i + 1 for i in ids] for ids in plain]
    pickle.loads(pickle.dumps(both.dataset))  # what workers receive
    with pytest.raises(TypeError, match="collate_fn must be a function or None"):
        StreamingDataLoader(ds, batch_size=8, collate_fn="stack")


def test_mesh_arguments_are_checked_naming_them(arrow_rows: pa.Table) -> None:
    """Issue 26: the mesh keywords say what they need (the meshes themselves run in
    tests/test_mesh.py, on Gloo processes)."""
    with pytest.raises(ValueError, match=r"dp_dims= names dims of a DeviceMesh: pass mesh="):
        StreamingDataset(arrow_rows, num_splits=2, dp_dims=("dp",))
    with pytest.raises(ValueError, match=r"read_on= names dims of a DeviceMesh: pass mesh="):
        StreamingDataset(arrow_rows, num_splits=2, read_on={"pp": [0]})
    with pytest.raises(ValueError, match=r"pass mesh= or process_group=, not both"):
        StreamingDataset(arrow_rows, num_splits=2, mesh="m", process_group=False)
    with pytest.raises(ValueError, match=r"mesh='m': expected a torch.distributed DeviceMesh"):
        StreamingDataset(arrow_rows, num_splits=2, mesh="m")
    assert StreamingDataset(arrow_rows, num_splits=2).mesh_coordinates is None
