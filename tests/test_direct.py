"""Direct reads of local Lance files (loader.read.direct) give exactly what `take` gives.

Real Lance datasets on disk: several fragments, deletions, filters, column subsets, several
pages a column; the same loader read with direct reads on and off must yield the same
batches (values, dtypes, shapes, key order), and direct reads must be used where the files
allow them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from loader.read.direct import open_direct

WIDTHS = (64, 128)  # float32 vectors of 256 and 512 bytes: Lance stores them in full-zip pages


def rows(start: int, stop: int, width: int, dtype: str) -> pa.Table:
    """Every value derived from the row's id, so a wrong row cannot pass."""
    ids = np.arange(start, stop, dtype=np.int64)
    x = (ids[:, None] * 1000 + np.arange(width)).astype(dtype).reshape(-1)
    return pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x), width),
            "label": (ids % 7).astype(np.int32),
        }
    )


def write(path: Path, n: int, width: int, dtype: str, per_file: int, **kw: object) -> str:
    """A dataset written in batches of 50 rows: with a small `data_cache_bytes` Lance cuts
    a column into several pages."""
    uri = str(path / "t.lance")
    table = rows(0, n, width, dtype)
    data = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=50))
    lance.write_dataset(data, uri, max_rows_per_file=per_file, **kw)  # type: ignore[arg-type]
    return uri


def batches(uri: str, direct: bool, **kw: object) -> list[dict[str, torch.Tensor]]:
    ds = StreamingDataset(uri, num_splits=4, shuffle_seed=3, shuffle_clump_size=8, **kw)  # type: ignore[arg-type]
    ds.reader.direct_reads = direct
    return list(StreamingDataLoader(ds, batch_size=16, read_size=64))


def same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, k
            assert torch.equal(x[k], y[k]), k


def uses_direct(uri: str, **kw: object) -> bool:
    ds = StreamingDataset(uri, num_splits=1, **kw)  # type: ignore[arg-type]
    return ds.reader._direct() is not None


@given(
    n=st.integers(40, 300),
    per_file=st.integers(30, 200),
    width=st.sampled_from(WIDTHS),
    dtype=st.sampled_from(["float32", "int32", "float64"]),
    deleted=st.lists(st.integers(0, 299), max_size=5),
    columns=st.sampled_from([None, ["x"], ["label", "x"], ["x", "id"]]),
    filtered=st.booleans(),
    cache_bytes=st.sampled_from([None, 8 << 10, 64 << 10]),
    version=st.sampled_from([None, "2.1"]),
)
@hyp_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_direct_reads_give_what_take_gives(
    n: int,
    per_file: int,
    width: int,
    dtype: str,
    deleted: list[int],
    columns: list[str] | None,
    filtered: bool,
    cache_bytes: int | None,
    version: str | None,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        kw = {"data_cache_bytes": cache_bytes, "data_storage_version": version}
        uri = write(Path(tmp), n, width, dtype, per_file, **kw)
        gone = sorted({d for d in deleted if d < n})
        if gone:
            lance.dataset(uri).delete(f"id IN ({', '.join(map(str, gone))})")
        read: dict[str, object] = {"columns": columns}
        if filtered:
            read["filter"] = "id % 3 != 1"
        same(batches(uri, True, **read), batches(uri, False, **read))
        # direct reads serve every table without deletions; with them, take does
        assert uses_direct(uri, **read) == (not gone)


def test_several_pages_and_fragments(tmp_path: Path) -> None:
    """A column over several pages in two fragments, gathered in any order."""
    uri = write(tmp_path, 3000, 128, "float32", 1800, data_cache_bytes=32 << 10)
    info = lance.dataset(uri)
    assert len(info.get_fragments()) == 2
    direct = open_direct(info, None, info.get_fragments(), uri)
    assert direct is not None and "x" not in direct.small
    assert max(len(c["x"].page_rows) - 1 for _, c in direct.files) > 1  # pages per file
    positions = np.random.default_rng(0).permutation(3000)[:2000]
    got = direct.gather(positions)
    want = info.take(positions, columns=["id", "x", "label"])
    assert torch.equal(got["id"], torch.from_numpy(want["id"].to_numpy().copy()))
    x = want["x"].combine_chunks().values.to_numpy().reshape(-1, 128)
    assert torch.equal(got["x"], torch.from_numpy(x.copy()))
    assert got["label"].dtype == torch.int32


def test_other_columns_keep_take(tmp_path: Path) -> None:
    """A string column, or narrow vectors only, leave the table on `take`."""
    uri = str(tmp_path / "s.lance")
    table = rows(0, 50, 128, "float32").append_column("name", pa.array([str(i) for i in range(50)]))
    lance.write_dataset(table, uri)
    assert not uses_direct(uri)
    assert uses_direct(uri, columns=["x", "id"])
    narrow = write(tmp_path / "n", 50, 2, "float32", 100)
    assert not uses_direct(narrow)
    same(batches(uri, True, columns=["x", "id"]), batches(uri, False, columns=["x", "id"]))


def _loader(uri: str, direct: bool, **kw: object) -> StreamingDataLoader:
    ds = StreamingDataset(uri, num_splits=4, shuffle_seed=3, shuffle_clump_size=8)
    ds.reader.direct_reads = direct
    return StreamingDataLoader(ds, batch_size=16, read_size=64, **kw)  # type: ignore[arg-type]


def test_resume_mid_epoch(tmp_path: Path) -> None:
    """After a resume mid-epoch direct reads give the batches take gives uninterrupted."""
    uri = write(tmp_path, 400, 128, "float32", 150, data_cache_bytes=16 << 10)
    assert uses_direct(uri)
    first = _loader(uri, True)
    it = iter(first)
    head = [next(it) for _ in range(9)]
    resumed = _loader(uri, True)
    resumed.load_state_dict(first.state_dict())
    same(head + list(resumed), batches(uri, False))


@pytest.mark.slow
def test_workers(tmp_path: Path) -> None:
    """Direct reads in DataLoader workers (each maps the files itself) give take's batches."""
    uri = write(tmp_path, 400, 128, "float32", 150, data_cache_bytes=16 << 10)
    same(list(_loader(uri, True, num_workers=2)), batches(uri, False))
