"""A narrow packed batch (`pack_fields`, `pack_dtype`): the default batch's fields, fewer
and narrower, across workers, a resume and a mixture; the fields derived from input_ids and
cu_seqlens equal the default ones; the state does not depend on the choice."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import MixedDataset, StreamingDataLoader, StreamingDataset, derive_packed_fields
from loader.kernels.ragged import _pack_blocks
from loader.packed_batch import PACK_FIELDS, pack_dtype
from loader.packing import EpochBlocks, PackSpec
from loader.read.packed_reader import IGNORE_INDEX, block_documents, pack
from tests import reference
from tests.test_packing import EOS, PAD, documents, token_table

NARROW = ["input_ids", "cu_seqlens"]
ARRAYS = PACK_FIELDS[:4]


def loader(
    table: pa.Table, world: int = 1, rank: int = 0, workers: int = 0, **kw: Any
) -> StreamingDataLoader:
    ds = StreamingDataset(
        table, columns=["tokens"], num_splits=4, rank=rank, world_size=world, eos_id=EOS,
        shuffle_clump_size=3, pack_sequences=kw.pop("seq_len", 16), **kw,
    )  # fmt: skip
    return StreamingDataLoader(ds, global_batch_size=8, num_workers=workers)


def narrowed(batch: dict[str, torch.Tensor], fields: list[str], dtype: Any) -> dict[str, Any]:
    """The default batch's `fields`, as a narrow batch holds them."""
    return {k: v if k == "cu_seqlens" else v.to(dtype) for k, v in batch.items() if k in fields}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=15),
    seq_len=st.integers(1, 9),
    extra=st.integers(0, 2),
    fields=st.sets(st.sampled_from(PACK_FIELDS[1:])),
    dtype=st.sampled_from(["int32", "int64"]),
)
def test_the_kernel_writes_the_twins_fields_it_is_asked_for(
    lengths: list[int], seq_len: int, extra: int, fields: set[str], dtype: str
) -> None:
    docs = documents(lengths)
    count = -(-(sum(lengths) + len(lengths)) // seq_len) + extra
    prefix = np.cumsum([0, *(n + 1 for n in lengths)]).reshape(1, -1)
    layout = EpochBlocks(prefix, seq_len, count)
    found, block_docs, first = block_documents(
        layout, np.zeros(count, np.int64), np.arange(count, dtype=np.int64)
    )
    offsets = np.cumsum([0, *lengths]).astype(np.int64)
    values = np.array([t for d in docs for t in d], dtype=np.int32)
    kept = ("input_ids", *sorted(fields, key=PACK_FIELDS.index))
    spec = PackSpec(seq_len, EOS, "tokens", PAD, count, kept, np.dtype(dtype))
    names, whole, starts, pieces = pack(spec, values, offsets, found, block_docs, first)
    got = dict(zip(names, whole, strict=True))
    want = reference.pack_blocks(docs, seq_len, EOS, PAD, count)
    assert list(got) == [name for name in kept if name in ARRAYS]
    for name, array in got.items():
        assert array.dtype == np.dtype(dtype)
        assert array.tolist() == [list(block[ARRAYS.index(name)]) for block in want]
    *_, default_starts, default_pieces = _pack_blocks(
        values, offsets, found, block_docs, first, seq_len, EOS, PAD, IGNORE_INDEX
    )
    assert pieces.tolist() == default_pieces.tolist()
    assert starts[: pieces[-1]].tolist() == default_starts[: pieces[-1]].tolist()


@pytest.mark.parametrize(
    ("fields", "dtype", "workers", "world"),
    [
        (NARROW, "int32", 0, 1),
        (NARROW, torch.int32, 2, 1),
        (["input_ids"], "int64", 0, 3),
        (["cu_seqlens", "position_ids", "input_ids"], np.int32, 0, 2),
        (None, "int32", 2, 2),
    ],
)
def test_narrow_batches_are_the_default_batches_narrowed(
    fields: list[str] | None, dtype: Any, workers: int, world: int
) -> None:
    table = token_table([(7 * i) % 23 for i in range(60)])
    kept = list(PACK_FIELDS) if fields is None else fields
    torch_dtype = getattr(torch, pack_dtype(dtype).name)
    for rank in range(world):
        want = [narrowed(b, kept, torch_dtype) for b in loader(table, world, rank)]
        got = list(loader(table, world, rank, workers, pack_fields=fields, pack_dtype=dtype))
        assert len(got) == len(want) > 2
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
            # one storage a read, also from a worker: one hand-off, not one a field
            assert len({g[k].untyped_storage().data_ptr() for k in g if k != "cu_seqlens"}) == 1


def test_a_state_does_not_depend_on_the_fields_and_a_run_can_switch_at_a_resume() -> None:
    table = token_table([(5 * i) % 19 for i in range(150)])
    narrow_kw: dict[str, Any] = {"pack_fields": NARROW, "pack_dtype": "int32"}
    default, narrow = loader(table), loader(table, **narrow_kw)
    for step, _ in enumerate(zip(default, narrow, strict=True)):
        assert default.state_dict() == narrow.state_dict()
        if step == 2:
            break
    # a default run's state resumed narrow on W = 2, and a narrow run's resumed default
    for state, kw in ((default.state_dict(), narrow_kw), (narrow.state_dict(), {})):
        for rank in range(2):
            resumed = loader(table, world=2, rank=rank, **kw)
            resumed.load_state_dict(state)
            rest = list(resumed)
            want = list(loader(table, world=2, rank=rank, **kw))[3:]
            assert len(rest) == len(want) > 0
            for got, expected in zip(rest, want, strict=True):
                assert_same(got, expected)


def _packed_batches(lengths: list[int], seq_len: int, **kw: Any) -> list[dict[str, Any]]:
    ds = StreamingDataset(
        token_table(lengths), columns=["tokens"], num_splits=2, rank=0, world_size=1,
        eos_id=EOS, pack_sequences=seq_len, shuffle_clump_size=2, **kw,
    )  # fmt: skip
    return list(StreamingDataLoader(ds, batch_size=3))


@pytest.mark.filterwarnings("ignore:pack_sequences=.*yields no block")
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 20), min_size=2, max_size=30),
    seq_len=st.integers(1, 12),
    padded=st.booleans(),
)
def test_derived_fields_equal_the_default_batchs(
    lengths: list[int], seq_len: int, padded: bool
) -> None:
    """labels, position_ids and document_ids from input_ids and cu_seqlens alone, with and
    without padding (PAD is no document's token)."""
    kw: dict[str, Any] = {}
    if padded:
        total = sum(lengths) + len(lengths)
        kw = {"pad_id": PAD, "blocks_per_epoch": 2 * (-(-total // (2 * seq_len)) + 1)}
    for batch in _packed_batches(lengths, seq_len, **kw):
        for dtype in (torch.int32, torch.int64):
            ids = batch["input_ids"].to(dtype)
            derived = derive_packed_fields(ids, batch["cu_seqlens"], PAD if padded else None)
            for key, value in derived.items():
                assert value.dtype == torch.int64
                assert torch.equal(value, batch[key]), key


def test_derived_fields_run_on_the_tensors_device_and_dtype() -> None:
    batch = _packed_batches([3, 9, 0, 14, 2, 6], 5)[0]
    out = derive_packed_fields(batch["input_ids"], batch["cu_seqlens"], dtype=torch.int32)
    assert {v.dtype for v in out.values()} == {torch.int32}
    assert torch.equal(out["labels"].long(), batch["labels"])


def test_iterating_the_dataset_gives_narrow_blocks() -> None:
    table = token_table([4, 11, 0, 7, 9, 3, 12, 5])
    kw = {"columns": ["tokens"], "num_splits": 2, "rank": 0, "world_size": 1, "eos_id": EOS}
    plain = list(StreamingDataset(table, pack_sequences=6, **kw))
    narrow = list(
        StreamingDataset(table, pack_sequences=6, pack_fields=NARROW, pack_dtype="int32", **kw)
    )
    assert len(plain) == len(narrow) > 0
    for a, b in zip(plain, narrow, strict=True):
        assert_same(b, narrowed(a, NARROW, torch.int32))


def _mixture(fields: Any, dtypes: tuple[str, str]) -> StreamingDataLoader:
    parts = []
    for (docs, base), dtype in zip(((30, 0), (20, 100_000)), dtypes, strict=True):
        tokens = [[base + d * 100 + t + 1 for t in range(3 + d % 5)] for d in range(docs)]
        table = pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32()))})
        parts.append(
            StreamingDataset(
                table,
                columns=["tokens"],
                num_splits=2,
                rank=0,
                world_size=1,
                eos_id=0,
                pack_sequences=8,
                pack_fields=fields,
                pack_dtype=dtype,
            )
        )
    return StreamingDataLoader(MixedDataset(parts, [1, 2]), global_batch_size=6)


def test_a_packed_mixture_gives_the_narrow_fields() -> None:
    whole = list(itertools.islice(_mixture(None, ("int64", "int64")), 6))
    narrow = list(itertools.islice(_mixture(NARROW, ("int32", "int32")), 6))
    for a, b in zip(whole, narrow, strict=True):
        assert_same(b, {**narrowed(a, NARROW, torch.int32), "source": a["source"]})
    with pytest.raises(ValueError, match="same pack_fields and pack_dtype"):
        _mixture(NARROW, ("int32", "int64"))


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"pack_fields": ["labels"]}, ValueError, r"pack_fields=\['labels'\].*input_ids"),
        ({"pack_fields": ["input_ids", "mask"]}, ValueError, r"unknown \['mask'\].*choose from"),
        ({"pack_fields": ["input_ids"] * 2}, ValueError, "each name once"),
        ({"pack_fields": "input_ids"}, TypeError, "pack_fields must be a list of field names"),
        ({"pack_fields": 5}, TypeError, "pack_fields must be a list of field names"),
        ({"pack_dtype": "int16"}, ValueError, r"pack_dtype='int16'; expected one of \['int64', 'int32'\]"),
        ({"pack_dtype": torch.float32}, ValueError, "pack_dtype=torch.float32"),
        ({"pack_dtype": "int32", "eos_id": 2**31}, ValueError, r"eos_id \(pack_dtype=int32\)"),
        ({"pack_dtype": "int32", "pad_id": -(2**31) - 1, "blocks_per_epoch": 4}, ValueError, r"pad_id \(pack_dtype=int32\)"),
        ({"pack_sequences": None, "pack_fields": NARROW}, ValueError, "pack_fields requires pack_sequences"),
        ({"pack_sequences": None, "pack_dtype": "int32"}, ValueError, "pack_dtype requires pack_sequences"),
    ],
)  # fmt: skip
def test_bad_output_choices_are_refused_naming_the_argument(
    kw: dict[str, Any], error: type[Exception], message: str
) -> None:
    args = {"columns": ["tokens"], "num_splits": 2, "pack_sequences": 4, "eos_id": EOS} | kw
    if args["pack_sequences"] is None:
        args.pop("columns")
    with pytest.raises(error, match=message):
        StreamingDataset(token_table([3, 4, 5, 6]), rank=0, world_size=1, **args)


def test_pack_dtype_none_is_the_default() -> None:
    kw = {"columns": ["tokens"], "num_splits": 2, "rank": 0, "world_size": 1, "eos_id": EOS}
    table = token_table([3, 4, 5, 6])
    dtypes = {
        k: v.dtype
        for k, v in next(
            iter(StreamingDataset(table, pack_sequences=4, pack_dtype=None, **kw))
        ).items()
    }
    assert dtypes["input_ids"] == torch.int64 and dtypes["cu_seqlens"] == torch.int32
    StreamingDataset(table, pack_dtype=None, num_splits=2, rank=0, world_size=1)  # not packing


def test_ids_that_do_not_fit_int32_are_refused_at_construction() -> None:
    wide = pa.table({"tokens": pa.array([[1, 2], [3, 2**31]], pa.list_(pa.int64()))})
    kw = {"columns": ["tokens"], "num_splits": 2, "rank": 0, "world_size": 1, "eos_id": 0}
    StreamingDataset(wide, pack_sequences=2, **kw)  # int64: fine
    with pytest.raises(
        ValueError, match=r"holds ids in \[1, 2147483648\], outside pack_dtype=int32"
    ):
        StreamingDataset(wide, pack_sequences=2, pack_dtype="int32", **kw)
    fits = pa.table({"tokens": pa.array([[1, 2], [3, 2**31 - 1]], pa.list_(pa.int64()))})
    StreamingDataset(fits, pack_sequences=2, pack_dtype="int32", **kw)


def test_derive_packed_fields_refuses_what_would_give_wrong_fields() -> None:
    """Issue 24 item 6: cu_seqlens that end short of B*seq_len, lack a block's start, are
    float or decrease, and a float dtype, gave wrong fields instead of an error."""
    batch = _packed_batches([3, 9, 0, 14, 2, 6], 5)[0]
    ids, cu = batch["input_ids"], batch["cu_seqlens"]
    blocks, seq = ids.shape
    assert int(cu[-1]) == blocks * seq
    short = cu.clone()
    short[-1] -= 1
    inner = [int(c) for c in cu if int(c) % seq]  # the boundaries inside blocks
    no_start = torch.tensor(sorted({0, blocks * seq, *inner} - {seq}), dtype=cu.dtype)
    swapped = cu.clone()
    swapped[1], swapped[2] = cu[2], cu[1]
    for wrong in (short, no_start, swapped):
        with pytest.raises(ValueError, match="cu_seqlens"):
            derive_packed_fields(ids, wrong)
    derive_packed_fields(ids, short, check=False)  # the caller's choice: no host read
    with pytest.raises(ValueError, match="does not describe"):
        derive_packed_fields(ids, short, check=True)
    with pytest.raises(TypeError, match=r"cu_seqlens has dtype torch\.float32"):
        derive_packed_fields(ids, cu.float())
    with pytest.raises(TypeError, match=r"input_ids has dtype torch\.float32"):
        derive_packed_fields(ids.float(), cu)
    with pytest.raises(TypeError, match=r"dtype=torch\.float32"):
        derive_packed_fields(ids, cu, dtype=torch.float32)
    with pytest.raises(ValueError, match="expected 2 dimensions"):
        derive_packed_fields(ids.reshape(-1), cu)
