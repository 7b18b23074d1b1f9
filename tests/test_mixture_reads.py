"""Reading a mixture's task: the rows placed straight into one buffer equal the general
join, and a mixture's default read holds one default read per dataset (issue 27)."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest
import torch

from loader import StreamingDataLoader, StreamingDataset
from loader.mixture.dataset import MixedDataset
from loader.read.reader import BatchReader
from tests.tables import make_rows


def typed_table(base: int, rows: int) -> pa.Table:
    """Every fixed-width kind a row can hold, each value derived from the row's id."""
    ids = list(range(base, base + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "small": pa.array([i % 100 - 50 for i in ids], pa.int8()),
            "half": pa.array([i / 4 for i in ids], pa.float16()),
            "flag": pa.array([i % 3 == 0 for i in ids], pa.bool_()),
            "wide": pa.array([float(i) * 1.5 for i in ids], pa.float64()),
            "pair": pa.array([[i % 7, -i % 5, i % 3] for i in ids], pa.list_(pa.int16(), 3)),
            "vec": pa.array(
                [[i + k / 8 for k in range(5)] for i in ids], pa.list_(pa.float32(), 5)
            ),
        }
    )


REAL_READ = BatchReader.read


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every `BatchReader.read` from now on, in order (appended as they come);
    a later call counts into its own list only."""
    reads: list[int] = []

    def counted(self: BatchReader, positions: Any, sub_reads: int = 1) -> Any:
        reads.append(len(positions))
        return REAL_READ(self, positions, sub_reads)

    monkeypatch.setattr(BatchReader, "read", counted)
    return reads


def assert_same_batches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The same keys in the same order, each the same dtype and values."""
    assert len(got) == len(expected)
    for one, other in zip(got, expected, strict=True):
        assert list(one) == list(other)
        for key in one:
            assert one[key].dtype == other[key].dtype and torch.equal(one[key], other[key]), key


def test_rows_placed_in_one_copy_equal_the_general_join(monkeypatch: pytest.MonkeyPatch) -> None:
    def batches() -> list[dict[str, Any]]:
        datasets = [
            StreamingDataset(typed_table(k * 1000, rows), num_splits=splits, shuffle_seed=k)
            for k, (rows, splits) in enumerate([(50, 3), (31, 2), (17, 1)])
        ]
        mix = MixedDataset(datasets, [3, 2, 1], seed=4)
        loader = StreamingDataLoader(mix, global_batch_size=12, read_size=36)  # 3 steps a read
        return [batch for _ in range(2) for batch in loader]

    placed = batches()
    monkeypatch.setattr("loader.mixture.reader._numeric_columns", lambda table: None)
    joined = batches()
    assert len(placed) > 8
    assert_same_batches(placed, joined)


def test_a_mixtures_default_read_holds_one_default_read_per_dataset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27 point 7: a mixture's read makes one take per dataset, each with a fixed
    cost, so by default it reads as many rows as the datasets would read alone, together
    (3 × 8,192 rows here): a third of the takes of 8,192-row reads, the same batches."""
    sizes = [30_000, 20_000, 10_000]
    starts = [0, *itertools.accumulate(sizes)]

    def run(read_size: int | None) -> tuple[list[list[int]], list[int]]:
        reads = counted_reads(monkeypatch)
        datasets = [
            StreamingDataset(make_rows(a, a + n).select(["id", "label"]), num_splits=4)
            for a, n in zip(starts, sizes, strict=False)
        ]
        kw = {} if read_size is None else {"read_size": read_size}
        loader = StreamingDataLoader(MixedDataset(datasets), global_batch_size=1024, **kw)
        ids = [batch["id"].tolist() for batch in loader]
        return ids, reads

    default, default_reads = run(None)
    small, small_reads = run(8192)
    steps = len(default)  # 59 steps of 1,024 rows: reads of 24 steps, or of 8
    assert default == small and steps == -(-sum(sizes) // 1024) == 59
    assert sum(default_reads) == sum(small_reads) == steps * 1024
    # a read per dataset, and one more where a pass ends inside the read
    assert 3 * -(-steps // 24) <= len(default_reads) <= 3 * -(-steps // 24) + 3
    assert 3 * -(-steps // 8) <= len(small_reads) <= 3 * -(-steps // 8) + 3
    assert len(default_reads) * 2 < len(small_reads)


def test_a_placement_that_fails_on_a_later_dataset_reads_the_placed_ones_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dataset's read is dropped once placed; when a later dataset's read cannot be placed
    (here: the last dataset's columns come in another order), the ones placed before it are
    read again for the general join, which gives what the join of reads kept from the start
    gives."""

    def batches() -> list[dict[str, Any]]:
        tables = [typed_table(k * 1000, rows) for k, rows in enumerate([40, 30, 20])]
        tables[2] = tables[2].select(tables[2].column_names[::-1])
        datasets = [StreamingDataset(t, num_splits=2, shuffle_seed=k) for k, t in enumerate(tables)]
        loader = StreamingDataLoader(MixedDataset(datasets, [4, 3, 2]), global_batch_size=9)
        return [batch for _ in range(2) for batch in loader]

    reads = counted_reads(monkeypatch)
    again = batches()
    read_again = len(reads)
    reads.clear()
    monkeypatch.setattr("loader.mixture.reader._numeric_columns", lambda table: None)
    kept = batches()
    assert read_again > len(reads), "no placed read was read again"
    assert len(again) > 10
    assert_same_batches(again, kept)
