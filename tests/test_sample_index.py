"""The epoch's sample index: the kernel equals its NumPy twin (searchsorted on the prefix
sums), and the documents of blocks found by lookups in it equal those main (3b19824) found
by searching the prefix sums on every read, over sizes, seq_len, clumps and padding."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from loader.kernels.ragged import _sample_index
from loader.packing import EpochBlocks, PackedTokens, PackSpec
from loader.plan import PlanSpec
from loader.read.packed_reader import block_documents

Arrays = tuple[NDArray[np.int64], ...]


def sample_index_twin(prefix: NDArray[np.int64], seq_len: int, blocks: int) -> Arrays:
    """By searching: the last document starting at or before each block edge (at most L)."""
    length = prefix.shape[1] - 1
    edges = np.arange(blocks + 1, dtype=np.int64) * seq_len
    docs = np.stack([np.searchsorted(row, edges, side="right") - 1 for row in prefix])
    docs = np.minimum(docs, length)
    return docs, edges - np.take_along_axis(prefix, docs, axis=1)


def block_documents_by_search(
    blocks: EpochBlocks, splits: NDArray[np.int64], levels: NDArray[np.int64]
) -> Arrays:
    """main's `block_documents` (3b19824): two searches per split on every read."""
    length = blocks.prefix.shape[1] - 1
    first = np.zeros(len(splits), dtype=np.int64)
    last = np.zeros(len(splits), dtype=np.int64)
    for split in np.unique(splits):
        mine = splits == split
        starts = blocks.prefix[split]
        begin = levels[mine] * blocks.seq_len
        first[mine] = np.minimum(np.searchsorted(starts, begin, side="right") - 1, length)
        last[mine] = np.minimum(
            np.searchsorted(starts, begin + blocks.seq_len, side="left"), length
        )
    counts = last - first
    block_docs = np.zeros(len(splits) + 1, dtype=np.int64)
    np.cumsum(counts, out=block_docs[1:])
    base = splits * length + first - block_docs[:-1]
    documents = np.repeat(base, counts) + np.arange(block_docs[-1], dtype=np.int64)
    starts_of_first = blocks.prefix[splits, first]
    first_offsets = np.where(first < length, levels * blocks.seq_len - starts_of_first, 0)
    return documents, block_docs, first_offsets


@st.composite
def layouts(draw: st.DrawFn) -> EpochBlocks:
    """An epoch's blocks from a real plan: S splits, clumps, shuffled or not, and padding
    blocks past a split's end when blocks_per_epoch asks for more than it holds."""
    splits = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 40), min_size=splits, max_size=60))
    seq_len = draw(st.integers(1, 50))
    plan = PlanSpec(
        len(lengths),
        splits,
        draw(st.booleans()),
        draw(st.integers(0, 2**32)),
        draw(st.integers(1, 20)),
    )
    padded = draw(st.booleans())
    total = sum(lengths) + len(lengths)
    per_split = draw(st.integers(1, total // seq_len // splits + 3)) if padded else None
    spec = PackSpec(seq_len, -1, "tokens", -2 if padded else None, per_split and per_split * splits)
    packing = PackedTokens(spec, plan, np.array(lengths, dtype=np.int32))
    with warnings.catch_warnings():  # an epoch of no block warns; it is a case too
        warnings.simplefilter("ignore")
        return packing.epoch(draw(st.integers(0, 3)))


@settings(max_examples=300, deadline=None)
@given(layout=layouts(), data=st.data())
def test_sample_index_matches_the_twin_and_block_lookups_the_searches(
    layout: EpochBlocks, data: st.DataObject
) -> None:
    docs, offsets = layout.sample_index
    want_docs, want_offsets = sample_index_twin(
        layout.prefix, layout.seq_len, layout.blocks_per_split
    )
    assert docs.tolist() == want_docs.tolist()
    assert offsets.tolist() == want_offsets.tolist()
    assert layout.sample_index is layout.sample_index  # once per epoch
    count = layout.num_splits * layout.blocks_per_split
    # a read's blocks: any of the epoch's (split, level) pairs, in any order, repeats allowed
    picked = np.array(data.draw(st.lists(st.integers(0, max(count - 1, 0)), max_size=40)))
    picked = picked[picked < count].astype(np.int64)
    splits, levels = np.divmod(picked, max(layout.blocks_per_split, 1))
    got = block_documents(layout, splits, levels)
    want = block_documents_by_search(layout, splits, levels)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == np.int64
        assert a.tolist() == b.tolist()


def test_sample_index_kernel_on_hand_made_prefix_sums() -> None:
    """Two splits of documents of 3, 1, 4 and 2, 2, 2 tokens (eos included), blocks of 3,
    and one padding edge past the first split's 8 tokens."""
    prefix = np.array([[0, 3, 4, 8], [0, 2, 4, 6]], dtype=np.int64)
    docs, offsets = _sample_index(prefix, 3, 3)
    assert docs.tolist() == [[0, 1, 2, 3], [0, 1, 3, 3]]
    assert offsets.tolist() == [[0, 0, 2, 1], [0, 1, 0, 3]]
