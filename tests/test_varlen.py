"""Variable-length columns as tensors: every type, nulls, empty lists, any read size and workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from loader.kernels.ragged import _ragged_take
from loader.read.convert import Ragged, table_to_batch
from tests import reference

ROWS = 97
VARLEN_TYPES = {
    "tok32": pa.list_(pa.int32()),
    "tok64": pa.large_list(pa.int64()),
    "vec": pa.list_(pa.float32()),
    "flags": pa.list_(pa.bool_()),
}


@settings(max_examples=150)
@given(
    rows=st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6), min_size=1, max_size=20),
    data=st.data(),
)
def test_ragged_take_matches_twin(rows: list[list[int]], data: st.DataObject) -> None:
    order = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=30))
    offsets = np.cumsum([0, *map(len, rows)]).astype(np.int64)
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    got_values, got_offsets = _ragged_take(values, offsets, np.array(order, dtype=np.int64))
    want_values, want_offsets = reference.ragged_take(values.tolist(), offsets.tolist(), order)
    assert got_values.tolist() == want_values
    assert got_offsets.tolist() == want_offsets


def varlen_table(rows: int = ROWS) -> pa.Table:
    """Rows whose every column is derived from `id` (row 0 and every 7th have empty lists)."""
    ids = list(range(rows))
    lengths = [0 if i % 7 == 0 else i % 11 for i in ids]
    pairs = list(zip(ids, lengths, strict=True))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "tok32": pa.array(
                [[i * 100 + k for k in range(n)] for i, n in pairs],
                VARLEN_TYPES["tok32"],
            ),
            "tok64": pa.array([[i] * n for i, n in pairs], VARLEN_TYPES["tok64"]),
            "vec": pa.array(
                [[i + k / 10 for k in range(n)] for i, n in pairs], VARLEN_TYPES["vec"]
            ),
            "flags": pa.array(
                [[k % 2 == 0 for k in range(n)] for n in lengths], VARLEN_TYPES["flags"]
            ),
            "blob": pa.array([bytes([i % 256]) * n for i, n in pairs], pa.binary()),
            "big_blob": pa.array([b"x" * n for n in lengths], pa.large_binary()),
            "text": pa.array([f"row-{i}" for i in ids], pa.string()),
        }
    )


def check_batch(batch: dict[str, Any]) -> list[int]:
    """Every column agrees with the batch's ids, in the documented form."""
    ids = batch["id"].tolist()
    for name in ("tok32", "tok64", "vec", "flags", "blob", "big_blob"):
        assert isinstance(batch[name], Ragged), name
        assert len(batch[name]) == len(ids)
    assert batch["tok32"].values.dtype == torch.int32
    assert batch["tok64"].values.dtype == torch.int64
    assert batch["blob"].values.dtype == torch.uint8
    table = varlen_table()
    for i, tokens, same, vec, blob in zip(
        ids,
        batch["tok32"].tolist(),
        batch["tok64"].tolist(),
        batch["vec"].tolist(),
        batch["blob"].tolist(),
        strict=True,
    ):
        assert tokens.tolist() == table["tok32"][i].as_py()
        assert same.tolist() == table["tok64"][i].as_py()
        assert np.allclose(vec.numpy(), table["vec"][i].as_py())
        assert bytes(blob.numpy()) == table["blob"][i].as_py()
    assert batch["text"] == [f"row-{i}" for i in ids]
    return ids


def test_every_type_in_its_documented_form() -> None:
    table = varlen_table()
    order = np.array([5, 0, 14, 3], dtype=np.int64)  # includes empty lists (rows 0, 14)
    batch = table_to_batch(table, order)
    assert check_batch(batch) == order.tolist()
    assert batch["tok32"].lengths.tolist() == [5, 0, 0, 3]
    padded = batch["tok32"].padded(-1)
    assert padded.shape == (4, 5)
    assert padded[1].tolist() == [-1] * 5
    assert batch["tok32"].cu_seqlens.dtype == torch.int32
    halves = batch["tok32"][1:3]
    assert halves.offsets.tolist() == [0, 0, 0] and len(halves.values) == 0


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("score", pa.array([1.0, None, 3.0])),
        ("label", pa.array([1, 2, None])),
        ("tokens", pa.array([[1], None, [2]], pa.list_(pa.int32()))),
        ("tokens", pa.array([[1], [None], [2]], pa.list_(pa.int32()))),
        ("emb", pa.array([[1.0, 2.0], [3.0, None], [5.0, 6.0]], pa.list_(pa.float32(), 2))),
        ("jpeg", pa.array([b"a", None, b"c"])),
    ],
)
def test_a_null_is_an_error_naming_the_column(column: str, values: pa.Array) -> None:
    table = pa.table({"id": [0, 1, 2], column: values})
    with pytest.raises(ValueError, match=f"column '{column}'.*null.*IS NOT NULL"):
        table_to_batch(table, np.array([0, 1, 2]))


def test_strings_keep_their_nulls_as_none() -> None:
    table = pa.table({"text": pa.array(["a", None, "c"])})
    assert table_to_batch(table, np.array([2, 1]))["text"] == ["c", None]


def test_a_null_fails_whatever_the_read_size(tmp_path: Path) -> None:
    """#10.15: the batch type never depends on read_size; a null row read alone or with
    others gives the same error (before, it silently turned the read into Python lists)."""
    table = pa.table({"id": pa.array(range(40), pa.int64()), "x": pa.array([*range(39), None])})
    db = lancedb.connect(str(tmp_path)).create_table("nulls", table)
    for read_size in (1, 8192):
        ds = StreamingDataset(db, num_splits=1, shuffle=False, rank=0, world_size=1)
        loader = StreamingDataLoader(ds, batch_size=4, read_size=read_size)
        with pytest.raises(ValueError, match="column 'x'"):
            list(loader)


@pytest.fixture(scope="module")
def varlen_lance(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = lancedb.connect(str(tmp_path_factory.mktemp("varlen")))
    table = varlen_table()
    created = db.create_table("varlen", table.slice(0, 50))
    created.add(table.slice(50))
    return created


def all_batches(source: Any, read_size: int, workers: int) -> list[dict[str, Any]]:
    ds = StreamingDataset(source, num_splits=4, shuffle_seed=5, rank=1, world_size=2)
    loader = StreamingDataLoader(ds, batch_size=6, num_workers=workers, read_size=read_size)
    return list(loader)


@pytest.mark.slow
def test_batches_are_identical_for_any_read_size_and_workers(varlen_lance: Any) -> None:
    runs = {(r, w): all_batches(varlen_lance, r, w) for r, w in [(6, 0), (8192, 0), (12, 2)]}
    base = runs[(8192, 0)]
    assert sum(len(check_batch(b)) for b in base) == ROWS // 4 * 2
    for key, batches in runs.items():
        assert len(batches) == len(base), key
        for got, want in zip(batches, base, strict=True):
            assert got["id"].tolist() == want["id"].tolist(), key
            for name in ("tok32", "vec", "blob"):
                assert torch.equal(got[name].values, want[name].values), (key, name)
                assert torch.equal(got[name].offsets, want[name].offsets), (key, name)
