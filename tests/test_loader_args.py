"""Constructor arguments are checked at construction; each error names the argument,
the value and the accepted range (issue #10 item 20), and what agrees with the plan from
torch/LitData code is accepted (the peers' section)."""

from __future__ import annotations

from typing import Any

import numpy as np
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
        ({"shuffle": False}, ValueError, r"shuffle=False contradicts the dataset"),
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
    with pytest.raises(ValueError, match="shuffle=True contradicts the dataset"):
        StreamingDataLoader(ordered, batch_size=100, shuffle=True)
