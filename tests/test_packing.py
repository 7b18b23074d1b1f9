"""Packed token blocks: the kernel equals its twin, blocks follow the plan alone, and a
save on one world size resumed on another hands out every block once."""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save
from loader.kernels.ragged import _batch_cu_seqlens, _pack_blocks
from loader.packing import EpochBlocks
from loader.read.packed_reader import IGNORE_INDEX, block_documents, cu_seqlens
from tests import reference

EOS, PAD = -1, -2
Block = tuple[int, ...]


def documents(lengths: list[int]) -> list[list[int]]:
    """Document i holds tokens i*1000 + 1 ... : every token of the table is unique."""
    return [[i * 1000 + k + 1 for k in range(n)] for i, n in enumerate(lengths)]


def token_table(lengths: list[int]) -> pa.Table:
    docs = documents(lengths)
    return pa.table({"tokens": pa.array(docs, pa.list_(pa.int32())), "id": np.arange(len(docs))})


@settings(max_examples=200)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=15),
    seq_len=st.integers(1, 9),
    extra=st.integers(0, 2),
    cuts=st.sets(st.integers(1, 100)),
)
def test_blocks_match_the_twin(
    lengths: list[int], seq_len: int, extra: int, cuts: set[int]
) -> None:
    """Locating documents by prefix sums and the kernel give the definition's blocks,
    padding blocks past the end included; a read's batches' cu_seqlens, made in one pass
    (`_batch_cu_seqlens`), are the twin's batch by batch."""
    docs = documents(lengths)
    total = sum(lengths) + len(lengths)
    count = -(-total // seq_len) + extra
    prefix = np.cumsum([0, *(n + 1 for n in lengths)]).reshape(1, -1)
    layout = EpochBlocks(prefix, seq_len, count)
    levels = np.arange(count, dtype=np.int64)
    found, block_docs, first = block_documents(layout, np.zeros(count, np.int64), levels)
    offsets = np.cumsum([0, *lengths]).astype(np.int64)
    values = np.array([t for d in docs for t in d], dtype=np.int64)
    *fields, piece_starts, block_pieces = _pack_blocks(
        values, offsets, found, block_docs, first, seq_len, EOS, PAD, -100
    )
    want = reference.pack_blocks(docs, seq_len, EOS, PAD, count)
    got = [tuple(f.tolist() for f in block) for block in zip(*fields, strict=True)]
    assert got == want
    for a, b in itertools.combinations(range(count + 1), 2):  # every batch of blocks [a, b)
        cu = cu_seqlens(piece_starts, block_pieces, a, b, seq_len)
        assert cu.dtype == np.int32
        assert cu.tolist() == reference.cu_seqlens(fields[3][a:b].tolist())
    bounds = np.array([0, *sorted(c for c in cuts if c < count), count], dtype=np.int64)
    every, firsts = _batch_cu_seqlens(piece_starts, block_pieces, bounds, seq_len)
    assert every.dtype == np.int32 and firsts[-1] == len(every)
    for i, (a, b) in enumerate(itertools.pairwise(bounds.tolist())):
        want_cu = cu_seqlens(piece_starts, block_pieces, a, b, seq_len)
        assert every[firsts[i] : firsts[i + 1]].tolist() == want_cu.tolist()


def split_documents(ds: StreamingDataset, lengths: list[int], epoch: int) -> list[list[list[int]]]:
    docs = documents(lengths)
    plan = ds.plan.epoch(epoch)
    return [[docs[p] for p in plan.split_rows(s).tolist()] for s in range(ds.num_splits)]


def expected_blocks(ds: StreamingDataset, lengths: list[int], epoch: int) -> list[list[Block]]:
    """Every split's blocks by the definition (twin), B of them each."""
    count = ds.units_per_split(epoch)
    assert ds.packing is not None
    seq_len = ds.packing.spec.seq_len
    return [
        [tuple(block[0]) for block in reference.pack_blocks(split, seq_len, EOS, PAD, count)]
        for split in split_documents(ds, lengths, epoch)
    ]


def loaders(
    source: Any, world: int, batch: int | None, global_batch: int | None = None, **kw: Any
) -> list[StreamingDataLoader]:
    out = []
    sizes = {"batch_size": batch} if global_batch is None else {"global_batch_size": global_batch}
    for rank in range(world):
        ds = StreamingDataset(
            source, columns=["tokens"], rank=rank, world_size=world, eos_id=EOS, **kw
        )
        out.append(StreamingDataLoader(ds, **sizes))
    return out


def take_batches(loader: StreamingDataLoader, steps: int | None) -> list[list[Block]]:
    """Blocks of each of the first `steps` batches (all if None), checking their fields."""
    batches: list[list[Block]] = []
    if steps == 0:
        return batches
    for step, batch in enumerate(loader):
        check_fields(batch)
        batches.append([tuple(row) for row in batch["input_ids"].tolist()])
        if step + 1 == steps:
            break
    return batches


def take(loader: StreamingDataLoader, steps: int | None) -> list[Block]:
    """Blocks of the first `steps` batches (all if None), checking each batch's fields."""
    return [blk for batch in take_batches(loader, steps) for blk in batch]


def check_fields(batch: dict[str, torch.Tensor]) -> None:
    ids, labels, docs = batch["input_ids"], batch["labels"], batch["document_ids"]
    same = (docs[:, 1:] == docs[:, :-1]) & (docs[:, 1:] >= 0)  # -1: padding
    assert torch.equal(labels[:, :-1][same], ids[:, 1:][same])
    assert bool((labels[:, :-1][~same] == IGNORE_INDEX).all())
    assert bool((labels[:, -1] == IGNORE_INDEX).all())
    flat = docs.reshape(-1)
    cu = batch["cu_seqlens"].tolist()
    assert cu == reference.cu_seqlens(docs.tolist())
    assert cu[0] == 0 and cu[-1] == flat.numel()
    for a, b in itertools.pairwise(cu):
        assert bool((flat[a:b] == flat[a]).all())
        if flat[a] >= 0:
            assert batch["position_ids"].reshape(-1)[a:b].tolist() == list(range(b - a))


@st.composite
def packed_jobs(draw: st.DrawFn) -> dict[str, Any]:
    splits = draw(st.sampled_from([1, 2, 3, 4, 6]))
    docs = draw(st.integers(splits, 40))
    per_batch = draw(st.integers(1, 3))  # G = S * per_batch
    worlds = st.integers(1, splits * per_batch)  # any W <= G: divisors of S or not
    return {
        "lengths": draw(st.lists(st.integers(0, 30), min_size=docs, max_size=docs)),
        "splits": splits,
        "seq_len": draw(st.integers(1, 16)),
        "global": splits * per_batch,
        "world": draw(worlds),
        "new_world": draw(worlds),
        "seed": draw(st.integers(0, 100)),
        "epoch": draw(st.integers(0, 2)),
        "cut": draw(st.floats(0, 1, exclude_max=True)),
        "padded": draw(st.booleans()),
    }


@settings(max_examples=150, deadline=None)
@given(job=packed_jobs())
def test_packed_resume_on_another_world_size(job: dict[str, Any]) -> None:
    """Blocks are the plan's (twin), global batches are the same on any W, and a crash on W
    resumed on W' hands out every block once; tokens dropped are counted."""
    table = token_table(job["lengths"])
    splits, g = job["splits"], job["global"]
    kw: dict[str, Any] = {
        "num_splits": splits,
        "shuffle_seed": job["seed"],
        "epoch": job["epoch"],
        "pack_sequences": job["seq_len"],
    }
    if job["padded"]:
        total = sum(job["lengths"]) + len(job["lengths"])
        kw.update(pad_id=PAD, blocks_per_epoch=splits * max(1, total // job["seq_len"] // splits))
    whole = loaders(table, 1, g, **kw)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        empty = whole.streaming_dataset.units_per_split(job["epoch"]) == 0
    assert empty == any("yields no block" in str(w.message) for w in caught)
    assume(not empty)  # a split holds less than one block: an empty epoch, with a warning
    ds = whole.streaming_dataset
    want = expected_blocks(ds, job["lengths"], job["epoch"])
    count = ds.units_per_split(job["epoch"])
    uninterrupted = [sorted(map(tuple, b["input_ids"].tolist())) for b in whole]
    everything = Counter(blk for split in want for blk in split)
    assert Counter(blk for batch in uninterrupted for blk in batch) == everything
    assert whole.state_dict()["token_offsets"] == [0] * splits  # the next epoch's start

    first = loaders(table, job["world"], None, g, **kw)
    steps = int(job["cut"] * len(first[0]))
    before = [take_batches(loader, steps) for loader in first]
    assert len({len(rank) for rank in before}) == 1, "the same number of steps on every rank"
    saved = first[0].state_dict()
    assert all(loader.state_dict() == saved for loader in first)
    assert len(saved["token_offsets"]) == splits
    second = loaders(table, job["new_world"], None, g, **kw)
    for loader in second:
        loader.load_state_dict(saved)
    skipped = second[0].state_dict()["skipped"]  # a last step with fewer blocks than ranks
    left = splits * count - steps * g
    assert skipped == (left % g if left % g < job["new_world"] else 0)
    after = [take_batches(loader, None) for loader in second]
    assert len({len(rank) for rank in after}) == 1, "the same number of steps on every rank"
    seen = Counter(blk for rank in before + after for batch in rank for blk in batch)
    assert sum(seen.values()) == splits * count - skipped
    assert not seen - everything, "no block twice, none from elsewhere"
    if skipped == 0:
        assert seen == everything
        # the epoch's tokens (eos included): in exactly one block, or counted as dropped
        real = sum(1 for blk in seen.elements() for t in blk if t != PAD)
        # every token (eos included) of the epoch's N documents, the N - S*L surplus ones
        # too: in exactly one block, or counted as dropped
        assert real + saved["tokens_dropped"] == sum(n + 1 for n in job["lengths"])
    # global batch t is the same blocks whatever the world size
    crashed = [sorted(blk for rank in before for blk in rank[t]) for t in range(steps)]
    assert crashed == uninterrupted[:steps]


def test_a_row_state_does_not_resume_packed_data_and_back(tmp_path: Path) -> None:
    table = token_table([5] * 20)
    rows = StreamingDataLoader(
        StreamingDataset(table, columns=["tokens"], num_splits=2, rank=0, world_size=1),
        batch_size=2,
    )
    packed = loaders(table, 1, 2, num_splits=2, pack_sequences=4)[0]
    with pytest.raises(ValueError, match="pack_sequences"):
        packed.load_state_dict(rows.state_dict())
    with pytest.raises(ValueError, match="pack_sequences"):
        rows.load_state_dict(packed.state_dict())
    bad = packed.state_dict() | {"token_offsets": [1, 0]}
    bad["epoch"] = 0
    bad["cursors"] = [0, 0]
    with pytest.raises(ValueError, match="not on a block edge"):
        packed.load_state_dict(bad)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pack_sequences": 8}, "eos_id is required"),
        ({"pack_sequences": 8, "eos_id": 0, "columns": None}, "exactly one token column"),
        ({"pack_sequences": 0, "eos_id": 0}, "pack_sequences must be"),
        ({"pack_sequences": 8, "eos_id": 0.5}, "eos_id must be an integer"),
        ({"pack_sequences": 8, "eos_id": 0, "blocks_per_epoch": 3}, "divisible by num_splits"),
        ({"pack_sequences": 8, "eos_id": 0, "blocks_per_epoch": 4}, "pass pad_id"),
        ({"blocks_per_epoch": 4}, "requires pack_sequences"),
        ({"pack_sequences": 8, "eos_id": 0, "columns": ["id"]}, "list of integers"),
    ],
)
def test_bad_packing_arguments_say_what_to_fix(kw: dict[str, Any], message: str) -> None:
    args = {"columns": ["tokens"], "num_splits": 2, "rank": 0, "world_size": 1} | kw
    with pytest.raises((ValueError, TypeError), match=message):
        StreamingDataset(token_table([3] * 10), **args)


@pytest.mark.slow
def test_packed_lance_resume_with_workers_and_checkpoint_file(tmp_path: Path) -> None:
    """Through a real LanceDB table in two fragments: W=2 (one rank with 2 workers) saves a
    checkpoint file mid-epoch; W=1 resumes from it; blocks are the twin's, each once."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 60, 120).tolist()
    table = token_table(lengths)
    db = lancedb.connect(str(tmp_path / "db"))
    lance_table = db.create_table("docs", table.slice(0, 70))
    lance_table.add(table.slice(70))
    kw = {"num_splits": 4, "shuffle_seed": 11, "pack_sequences": 32}
    first = loaders(lance_table, 2, 4, **kw)
    first[1] = StreamingDataLoader(first[1].streaming_dataset, batch_size=4, num_workers=2)
    before = [take(loader, 3) for loader in first]
    save(first[0].state_dict(), tmp_path / "state.ckpt")
    second = loaders(lance_table, 1, 8, **kw)[0]
    second.load_state_dict(load(tmp_path / "state.ckpt"))
    after = take(second, None)
    ds = second.streaming_dataset
    want = expected_blocks(ds, lengths, 0)
    seen = Counter(blk for blocks in [*before, after] for blk in blocks)
    assert seen == Counter(blk for split in want for blk in split)
    assert second.state_dict()["epoch"] == 1


def test_dataset_iteration_yields_single_blocks() -> None:
    table = token_table([7] * 12)
    ds = StreamingDataset(
        table, columns=["tokens"], num_splits=2, rank=0, world_size=1,
        pack_sequences=np.int64(8), eos_id=np.int32(EOS),  # NumPy integers are integers
    )  # fmt: skip
    blocks = list(ds)
    assert len(blocks) == 2 * ds.units_per_split(0)
    assert blocks[0]["input_ids"].shape == (8,)
    assert ds.state_dict()["epoch"] == 1


def test_progress_telemetry_carries_tokens() -> None:
    """The loader's snapshot (what progress events carry) counts tokens when packing, and the
    collector's schema accepts the field."""
    from dashboard.collector.models import EventIn
    from loader.telemetry.client import position_fields
    from loader.telemetry.reporter import position_of

    loader = loaders(token_table([9] * 16), 1, 2, num_splits=2, pack_sequences=4)[0]
    take(loader, 3)
    position = position_fields(position_of(loader), 2)
    assert position["tokens"] == 3 * 2 * 4
    event = {"run_id": "r", "kind": "progress", "ts": 1.0, "rank": 0, "world_size": 1}
    assert EventIn(**event, num_splits=2, **position).tokens == 24
    rows = StreamingDataLoader(
        StreamingDataset(token_table([3] * 4), num_splits=1, rank=0, world_size=1), batch_size=2
    )
    assert "tokens" not in position_of(rows)


def test_resume_reads_nothing_before_the_first_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_state_dict is O(S) on the cached lengths: no read of what came before."""
    from loader.sources.arrow import ArrowRows

    table = token_table([13] * 40)
    saver = loaders(table, 1, 2, num_splits=4, pack_sequences=8)[0]
    take(saver, 5)
    state = saver.state_dict()
    resumed = loaders(table, 2, 1, num_splits=4, pack_sequences=8)[1]
    reads: list[int] = []
    original = ArrowRows.take

    def counting(self: ArrowRows, positions: Any) -> pa.Table:
        reads.append(len(positions))
        return original(self, positions)

    monkeypatch.setattr(ArrowRows, "take", counting)
    resumed.load_state_dict(state)
    assert reads == []
    next(iter(resumed))
    assert len(reads) == 1, "the first batch is one read"


@pytest.mark.slow
def test_packed_batches_do_not_depend_on_read_size_or_workers(tmp_path: Path) -> None:
    lengths = np.random.default_rng(5).integers(0, 40, 90).tolist()
    db = lancedb.connect(str(tmp_path)).create_table("docs", token_table(lengths))
    runs = []
    for read_size, workers in [(8192, 0), (3, 0), (5, 2)]:
        ds = StreamingDataset(
            db, columns=["tokens"], num_splits=4, rank=1, world_size=2, shuffle_seed=2,
            pack_sequences=16, eos_id=EOS,
        )  # fmt: skip
        loader = StreamingDataLoader(ds, batch_size=3, num_workers=workers, read_size=read_size)
        runs.append([{k: v.tolist() for k, v in batch.items()} for batch in loader])
    assert runs[0] and runs[1] == runs[0] and runs[2] == runs[0]


def test_packed_reads_default_to_a_quarter_million_tokens() -> None:
    """read_size counts blocks when packing; its default is 2**18 tokens' worth, not 8192
    blocks (which at seq_len 2048 would allocate ~0.5 GB of fields per read)."""
    table = token_table([30] * 40)
    assert loaders(table, 1, 4, num_splits=2, pack_sequences=2048)[0].batches_per_read == 32
    assert loaders(table, 1, 4, num_splits=2, pack_sequences=8)[0].batches_per_read == 2**13
    rows = StreamingDataLoader(
        StreamingDataset(table, num_splits=2, rank=0, world_size=1), batch_size=4
    )
    assert rows.batches_per_read == 2048


def test_a_filter_packs_only_the_documents_it_keeps(tmp_path: Path) -> None:
    lengths = [5, 9, 0, 7, 12, 3, 8, 6] * 5
    db = lancedb.connect(str(tmp_path)).create_table("docs", token_table(lengths))
    kw = {"num_splits": 2, "pack_sequences": 4, "shuffle_seed": 9, "filter": "id % 2 = 0"}
    loader = loaders(db, 1, 2, **kw)[0]
    ds = loader.streaming_dataset
    assert ds.num_rows == 20
    docs = documents(lengths)
    plan = ds.plan.epoch(0)
    rows = ds.source.rows
    assert rows is not None
    want = [
        [tuple(b[0]) for b in reference.pack_blocks(
            [docs[rows[p]] for p in plan.split_rows(s).tolist()], 4, EOS, PAD, ds.units_per_split(0)
        )]
        for s in range(2)
    ]  # fmt: skip
    assert Counter(take(loader, None)) == Counter(blk for split in want for blk in split)


def test_inspect_labels_a_packed_state_in_documents_and_tokens(tmp_path: Path) -> None:
    """A packed state's cursors count documents and its `skipped` counts blocks: inspect
    says so (and the tokens into the next documents), never "rows"."""
    from loader.tools.inspect import format_inspect

    loader = loaders(token_table([13] * 40), 1, 2, num_splits=4, pack_sequences=8)[0]
    take(loader, 5)
    state = loader.state_dict()
    out = format_inspect(save(state, tmp_path / "packed.json"))
    docs, into = sum(state["cursors"]), sum(state["token_offsets"])
    for expected in [
        "N=40 documents, S=4 splits x L=10 documents",
        "  packing     blocks of 8 tokens of column tokens, eos_id -1, pad_id -, blocks_per_epoch -",
        f"document cursor min {min(state['cursors'])}",
        "of 10 documents per split",
        f"  read        {docs} documents + {into} tokens into the next ones, ",
        f"skipped 0 blocks; {state['tokens_dropped']} tokens of the epoch dropped",
    ]:
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert " rows" not in out
