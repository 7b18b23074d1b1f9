"""Whole-unit reads of packed tokens (loader/read/clumps.py): the same batches as one sorted take
of exactly the documents, each unit read once per process, and the packed clump default."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from loader.packing import PACKED_CLUMP
from loader.read.clumps import ReadUnits, UnitCache, gather, read_units, split_units
from loader.read.packed_reader import PackedReader
from tests.test_packing import token_table

FIXTURE = Path(__file__).parent / "fixtures" / "packed-state-before-clump-default.json"


def packed_batches(
    table: pa.Table, units: bool, read_size: int, workers: int = 0, **kw: Any
) -> tuple[list[dict[str, torch.Tensor]], int]:
    """Every batch of one epoch, and how many tasks were packed from whole units (w = 0)."""
    ds = StreamingDataset(table, columns=["tokens"], rank=0, world_size=1, eos_id=-1, **kw)
    reader = ds.reader
    assert isinstance(reader, PackedReader)
    reader.unit_reads = units  # on by default only for object stores; the batches must agree
    used = []
    if workers == 0:  # workers pickle the reader: no spy there
        from_units = reader._from_units
        reader._from_units = lambda *a: used.append(1) or from_units(*a)  # type: ignore[method-assign]
    loader = StreamingDataLoader(ds, batch_size=2, read_size=read_size, num_workers=workers)
    return list(loader), len(used)


def assert_same(left: list[dict[str, torch.Tensor]], right: list[dict[str, torch.Tensor]]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=8, max_size=120),
    clump=st.integers(2, 40),
    splits=st.sampled_from([1, 2, 4]),
    seq_len=st.integers(1, 12),
    read_size=st.sampled_from([2, 4, 8]),
    shuffle=st.booleans(),
    padded=st.integers(0, 3),
)
def test_whole_unit_reads_give_the_same_batches(
    lengths: list[int],
    clump: int,
    splits: int,
    seq_len: int,
    read_size: int,
    shuffle: bool,
    padded: int,
) -> None:
    kw = {"num_splits": splits, "pack_sequences": seq_len, "shuffle_clump_size": clump}
    kw |= {"shuffle": shuffle, "shuffle_seed": 5}
    if padded:  # blocks past a split's end: padding, and documents of none
        blocks = splits * (-(-(sum(lengths) + len(lengths)) // (seq_len * splits)) + padded)
        kw |= {"blocks_per_epoch": blocks, "pad_id": -2}
    table = token_table(lengths)
    exact, none = packed_batches(table, False, read_size, **kw)
    whole, _ = packed_batches(table, True, read_size, **kw)
    assert none == 0
    assert_same(exact, whole)


def test_whole_unit_reads_are_used_and_hold_with_a_filter() -> None:
    table = token_table([(i * 5) % 17 for i in range(300)])
    kw = {"num_splits": 4, "pack_sequences": 6, "shuffle_clump_size": 32}
    kw |= {"filter": (pc.field("id") < 50) | (pc.field("id") > 120)}
    exact, _ = packed_batches(table, False, 2, **kw)
    whole, used = packed_batches(table, True, 2, **kw)
    assert used > 0  # the path under test ran
    assert_same(exact, whole)


@pytest.mark.slow
def test_whole_unit_reads_in_workers_give_the_same_batches() -> None:
    table = token_table([(i * 5) % 17 for i in range(300)])
    kw = {"num_splits": 4, "pack_sequences": 6, "shuffle_clump_size": 64}
    exact, _ = packed_batches(table, False, 2, **kw)
    whole, _ = packed_batches(table, True, 2, workers=2, **kw)
    assert_same(exact, whole)


def test_units_are_pieces_of_clumps() -> None:
    units = ReadUnits(clump=10, size=4, num_rows=25)  # clumps [0,10) [10,20) [20,25)
    positions = np.arange(25, dtype=np.int64)
    ids = units.ids(positions)
    spans = [units.span(int(u)) for u in np.unique(ids)]
    assert spans == [(0, 4), (4, 8), (8, 10), (10, 14), (14, 18), (18, 20), (20, 24), (24, 25)]
    assert all(a <= p < b for p, u in zip(positions, ids, strict=True) for a, b in [units.span(u)])
    assert read_units(256, 1000, 1e9, 4, True) is None  # a unit would hold one document
    assert read_units(256, 1000, 100.0, 4, False) == ReadUnits(1000, 1000, 1000)


def test_gather_takes_the_documents_in_order_from_their_units() -> None:
    docs = [list(range(10 * i, 10 * i + i % 4)) for i in range(12)]
    offsets = np.cumsum([0, *(len(d) for d in docs)]).astype(np.int64)
    values = np.array([t for d in docs for t in d], dtype=np.int32)
    units = ReadUnits(clump=4, size=4, num_rows=12)
    loaded = dict(enumerate(split_units(values, offsets, [4, 4, 4])))
    positions = np.array([1, 2, 5, 7, 8, 11], dtype=np.int64)  # a gap inside unit 1
    got, got_offsets = gather(units, positions, loaded)
    want = [docs[p] for p in positions]
    assert [got[a:b].tolist() for a, b in itertools.pairwise(got_offsets)] == want


def test_the_cache_reads_each_unit_once_across_threads_and_forgets_a_failed_read() -> None:
    cache, reads, gate = UnitCache(), [], threading.Event()

    def read(missing: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        reads.append(list(missing))
        assert gate.wait(10)
        return [(np.array([u]), np.array([0, 1])) for u in missing]

    out: list[Any] = []
    threads = [
        threading.Thread(target=lambda: out.append(cache.get([1, 2], read, 8))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert reads == [[1, 2]]
    assert [[int(v[0]) for v, _ in got] for got in out] == [[1, 2]] * 3

    def broken(missing: list[int]) -> list[Any]:
        raise OSError("store down")

    with pytest.raises(OSError, match="store down"):
        cache.get([3], broken, 8)
    reads.clear()
    assert [int(v[0]) for v, _ in cache.get([3], read, 8)] == [3]  # read again, not the error
    cache.get([4, 5, 6], read, 2)  # over capacity: the oldest are dropped
    reads.clear()
    cache.get([1], read, 2)
    assert reads == [[1]]


def test_packed_data_defaults_to_a_coarse_clump_and_rows_keep_theirs() -> None:
    """256 documents a clump, or fewer so that a table has at least 64 clumps to shuffle."""
    kw: dict[str, Any] = {"columns": ["tokens"], "num_splits": 2, "rank": 0, "world_size": 1}
    kw |= {"pack_sequences": 4, "eos_id": -1}
    for docs, clump in ((40, 1), (6400, 100), (64 * PACKED_CLUMP, PACKED_CLUMP), (50_000, 256)):
        packed = StreamingDataset(token_table([3] * docs), **kw)
        assert packed.plan.clump_size == clump, docs
    rows = StreamingDataset(token_table([3] * 40), num_splits=2, rank=0, world_size=1)
    assert rows.plan.clump_size == 1


def test_shuffle_shuffles_a_small_packed_table() -> None:
    """Issue 24 item 14: with the default clump of 256 documents, shuffle=True read a table of
    120 documents in table order (documents 0, 30, 60, 90, then 1, 31, 61, 91 on S=4)."""
    table = token_table([2] * 120)  # document d's tokens are d * 1000 + 1, d * 1000 + 2
    kw: dict[str, Any] = {"columns": ["tokens"], "num_splits": 4, "rank": 0, "world_size": 1}
    ds = StreamingDataset(table, pack_sequences=3, eos_id=-1, shuffle=True, **kw)
    batch = next(iter(StreamingDataLoader(ds, batch_size=8)))
    first = [(int(block[0]) - 1) // 1000 for block in batch["input_ids"]]  # each block's doc
    assert first != [0, 30, 60, 90, 1, 31, 61, 91], first
    assert sorted(first) != first


def test_a_packed_state_saved_with_the_old_default_resumes_with_its_clump_passed() -> None:
    """States saved before the packed default (clump 1): on this 40-document table the
    default is 1 again (it leaves 64 clumps), so it resumes as it is; a table whose default
    is coarser names the fix, and passing the clump resumes."""
    saved = json.loads(FIXTURE.read_text())
    table = token_table([(i * 7) % 13 for i in range(40)])
    kw = {"columns": ["tokens"], "num_splits": 4, "rank": 0, "world_size": 1}
    kw |= {"shuffle_seed": 3, "pack_sequences": 5, "eos_id": -1}
    default = StreamingDataLoader(StreamingDataset(table, **kw), batch_size=2)
    default.load_state_dict(saved["state"])
    assert next(iter(default))["input_ids"].tolist() == saved["next_input_ids"]
    coarse = StreamingDataLoader(StreamingDataset(table, shuffle_clump_size=8, **kw), batch_size=2)
    with pytest.raises(ValueError, match="shuffle_clump_size=1 but this loader has"):
        coarse.load_state_dict(saved["state"])
    loader = StreamingDataLoader(StreamingDataset(table, shuffle_clump_size=1, **kw), batch_size=2)
    loader.load_state_dict(saved["state"])
    assert next(iter(loader))["input_ids"].tolist() == saved["next_input_ids"]
