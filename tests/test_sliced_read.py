"""A read's batches hand off as its whole columns (loader.read.reader.SlicedRead): a worker pickles
one tensor per column, not one per column and batch, and the batches are the same."""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from loader import StreamingDataLoader, StreamingDataset
from loader.read.reader import SlicedRead


class TensorCounter(pickle.Pickler):
    """Counts the tensors a pickle holds (what torch's worker queue moves one by one)."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO())
        self.tensors = 0

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            self.tensors += 1
        return NotImplemented


def a_read(batches: int) -> SlicedRead:
    table = pa.table({"id": np.arange(64), "x": np.arange(64, dtype=np.float32)})
    ds = StreamingDataset(table, num_splits=4, rank=0, world_size=1, shuffle_clump_size=4)
    loader = StreamingDataLoader(ds, batch_size=64 // batches)
    task = loader.progress.start(loader._batching).task(0, batches)
    read = ds.reader.batches(task)
    assert isinstance(read, SlicedRead)
    return read


def test_a_read_pickles_one_tensor_per_column() -> None:
    read = a_read(8)
    counter = TensorCounter()
    counter.dump(read)
    assert counter.tensors == 2
    as_list = TensorCounter()
    as_list.dump(list(read))
    assert as_list.tensors == 16  # what a list of the batches would hand off


def test_a_read_is_a_sequence_of_its_batches() -> None:
    read = a_read(4)
    whole = pickle.loads(pickle.dumps(read))
    assert len(read) == len(whole) == 4
    for mine, theirs in zip(read, whole, strict=True):
        assert torch.equal(mine["id"], theirs["id"]) and torch.equal(mine["x"], theirs["x"])
    assert torch.equal(read[-1]["id"], read[3]["id"])
    assert [
        torch.equal(a["id"], b["id"]) for a, b in zip(read[1:3], list(read)[1:3], strict=True)
    ] == [True, True]
    assert torch.cat([b["id"] for b in read]).tolist() == read.whole["id"].tolist()
    with pytest.raises(IndexError, match="batch 4 of a read of 4"):
        read[4]


def test_the_fixed_width_columns_of_a_read_share_one_storage() -> None:
    """One storage a read: a worker hands it over with one descriptor round trip, not one
    a column. The columns stay writable tensors of their own dtype and values."""
    read = a_read(4)
    ids, x = read.whole["id"], read.whole["x"]
    assert ids.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert (ids.dtype, x.dtype) == (torch.int64, torch.float32)
    assert x.tolist() == ids.to(torch.float32).tolist()  # x == id in a_read's table
    x[0] = -1.0  # writable, and only x changes
    assert ids[0].item() != -1
