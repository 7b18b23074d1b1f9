"""Constructor arguments are checked at construction; each error names the argument,
the value and the accepted range (issue #10 item 20), and what agrees with the plan from
torch/LitData code is accepted (the peers' section)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from loader import StreamingDataLoader, StreamingDataset

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
