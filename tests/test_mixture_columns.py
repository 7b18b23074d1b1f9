"""A mixture's datasets are judged by their schemas when it is built: differing types, a
`source` column, or other column sets are refused on every rank of every world size
(issue 24 items 1-3), never cast or let through by which rows a rank reads."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import torch

from loader import MixedDataset, StreamingDataLoader, StreamingDataset

BIG = 2**24  # float32 holds integers exactly only up to here


def dataset(table: pa.Table, rank: int = 0, world: int = 1, **kw: Any) -> StreamingDataset:
    return StreamingDataset(table, num_splits=2, shuffle=False, rank=rank, world_size=world, **kw)


def test_differing_types_are_refused_naming_the_column_and_both_types() -> None:
    a = pa.table({"v": pa.array([BIG + i for i in range(40)], pa.int64())})
    b = pa.table({"v": pa.array([float(i) for i in range(40)], pa.float32())})
    for world in (1, 2, 3):
        for rank in range(world):
            with pytest.raises(
                ValueError,
                match=r"column 'v' is int64 in datasets\['a'\] and float in datasets\['b'\].*transform",
            ):
                MixedDataset({"a": dataset(a, rank, world), "b": dataset(b, rank, world)}, [1, 1])


def test_a_cast_in_a_transform_mixes_exactly() -> None:
    a = pa.table({"v": pa.array([BIG + i for i in range(40)], pa.int64())})
    b = pa.table({"v": pa.array([float(i) for i in range(40)], pa.float32())})
    as_int = dataset(b, transform=lambda row: {"v": int(row["v"])})
    loader = StreamingDataLoader(
        MixedDataset({"a": dataset(a), "b": as_int}, [1, 1]), global_batch_size=8
    )
    batch = next(iter(loader))
    assert batch["v"].dtype == torch.int64
    assert batch["v"][batch["source"] == 0].tolist() == [BIG, BIG + 20, BIG + 1, BIG + 21]


def test_a_transform_that_gives_another_dtype_is_refused_when_joined() -> None:
    a = pa.table({"v": pa.array(range(40), pa.int64())})
    as_float = dataset(a, transform=lambda row: {"v": float(row["v"])})
    loader = StreamingDataLoader(MixedDataset([dataset(a), as_float], [1, 1]), global_batch_size=8)
    with pytest.raises(
        ValueError, match=r"column .v. is torch.int64 in one dataset .* torch.float64"
    ):
        next(iter(loader))


@pytest.mark.parametrize(
    "values", [pa.array(range(900, 940)), pa.array([f"s{i}" for i in range(40)])]
)
def test_a_column_named_source_is_refused(values: pa.Array) -> None:
    table = pa.table({"id": pa.array(range(40)), "source": values})
    for world in (1, 2):
        with pytest.raises(
            ValueError, match=r"datasets\['0'\] has a column named 'source'.*columns=\[\.\.\.\]"
        ):
            MixedDataset(
                [dataset(table, world - 1, world), dataset(table, world - 1, world)], [1, 1]
            )
    kept = [dataset(table, columns=["id"]), dataset(table, columns=["id"])]
    batch = next(iter(StreamingDataLoader(MixedDataset(kept, [1, 1]), global_batch_size=4)))
    assert sorted(batch["source"].tolist()) == [0, 0, 1, 1]  # the dataset index, in any layout


def test_a_transform_giving_source_is_refused_when_joined() -> None:
    table = pa.table({"id": pa.array(range(40))})
    tagged = dataset(table, transform=lambda row: {"id": row["id"], "source": 7})
    loader = StreamingDataLoader(MixedDataset([tagged, tagged], [1, 1]), global_batch_size=4)
    with pytest.raises(ValueError, match="column named 'source'"):
        next(iter(loader))


def test_other_column_sets_are_refused_on_every_world_size() -> None:
    one = pa.table({"id": pa.array(range(40))})
    two = pa.table({"id": pa.array(range(100, 140)), "y": pa.array(range(40))})
    for world in (1, 2, 4):
        for rank in range(world):
            with pytest.raises(
                ValueError,
                match=r"same columns: datasets\['0'\] has \['id'\], datasets\['1'\] \['id', 'y'\]",
            ):
                MixedDataset([dataset(one, rank, world), dataset(two, rank, world)], [3, 1])
