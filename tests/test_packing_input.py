"""Packed datasets and their input: a null token or a uint64 id past int64 is refused
naming the column; the state's `tokens_dropped` means what docs/packing.md says."""

from __future__ import annotations

import warnings
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset


def test_a_null_token_inside_a_document_is_an_error_naming_the_column() -> None:
    """Only null documents were refused: a null token was packed as -2**63 (#19.2)."""
    tokens = pa.array([[1, 2, None, 4], [5, 6, 7]] * 4, pa.list_(pa.int32()))
    with pytest.raises(ValueError, match=r"'tokens' has 4 null token"):
        StreamingDataset(
            pa.table({"tokens": tokens}), columns=["tokens"], num_splits=2, rank=0,
            world_size=1, pack_sequences=4, eos_id=0,
        )  # fmt: skip


def test_uint64_token_ids_are_exact_below_2_63_and_refused_above() -> None:
    """uint64 ids of 2**63 or more wrapped to negative input_ids (#19.3)."""
    big = 2**63 - 5
    docs = [[big + k for k in range(4)] for _ in range(8)]
    kw: dict[str, Any] = {
        "columns": ["tokens"], "num_splits": 2, "rank": 0, "world_size": 1,
        "pack_sequences": 5, "eos_id": 0, "shuffle": False,
    }  # fmt: skip
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.uint64()))})
    batch = next(iter(StreamingDataLoader(StreamingDataset(table, **kw), batch_size=2)))
    assert batch["input_ids"][0].tolist() == [big, big + 1, big + 2, big + 3, 0]
    docs[3][2] = 2**63
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.uint64()))})
    with pytest.raises(
        ValueError, match=r"'tokens' \(uint64\) holds id 9223372036854775808.*9223372036854775807"
    ):
        StreamingDataset(table, **kw)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=4, max_size=60),
    splits=st.sampled_from([2, 4]),
    seq_len=st.sampled_from([5, 8, 16]),
    padded=st.booleans(),
    seed=st.integers(0, 9),
)
def test_tokens_dropped_is_its_documented_definition(
    lengths: list[int], splits: int, seq_len: int, padded: bool, seed: int
) -> None:
    """Issue 24 item 7: the tokens in the epoch's blocks (padding aside) plus the state's
    `tokens_dropped` are the table's tokens plus one eos per document, for the state's epoch:
    mid-epoch the one being read, after its last batch the next (the state's position)."""
    docs = [[7 + (d * 31 + t) % 900 for t in range(n)] for d, n in enumerate(lengths)]
    table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))})
    kw: dict[str, Any] = {"columns": ["tokens"], "num_splits": splits, "pack_sequences": seq_len}
    kw.update(eos_id=0, shuffle_seed=seed, shuffle_clump_size=1)
    if padded:
        kw.update(pad_id=-1, blocks_per_epoch=splits * 3)
    total = sum(lengths) + len(lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an epoch with no block says so; its count still holds
        dl = StreamingDataLoader(StreamingDataset(table, **kw), batch_size=1)
        at_start = dl.state_dict()
        for epoch in range(3):
            kept, states = 0, []
            for batch in dl:
                kept += int((batch["document_ids"] >= 0).sum())
                states.append(dl.state_dict())
            assert (at_start["epoch"], at_start["tokens_dropped"]) == (epoch, total - kept)
            for state in states[:-1]:  # inside the epoch
                assert (state["epoch"], state["tokens_dropped"]) == (epoch, total - kept)
            at_start = dl.state_dict()  # after the last batch: the next epoch's start
