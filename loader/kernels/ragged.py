"""Kernels on ragged data (flat values + offsets): reorder rows, and pack token blocks.

Both walk each row's slice once with no temporary index arrays, so a reorder of n tokens
costs one copy of n values (NumPy's repeat/arange gather needs an int64 index per value).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.kernels.config import njit

# What `_pack_blocks` returns: six int64 arrays (see its docstring for each).
PackedArrays = tuple[
    NDArray[np.int64],
    NDArray[np.int64],
    NDArray[np.int64],
    NDArray[np.int64],
    NDArray[np.int64],
    NDArray[np.int64],
]


@njit
def _ragged_take(
    values: NDArray[np.generic], offsets: NDArray[np.int64], order: NDArray[np.int64]
) -> tuple[NDArray[np.generic], NDArray[np.int64]]:
    """Rows `order` of the ragged array (values, offsets): new values and offsets from 0."""
    out_offsets = np.empty(order.shape[0] + 1, dtype=np.int64)
    out_offsets[0] = 0
    for i in range(order.shape[0]):
        row = order[i]
        out_offsets[i + 1] = out_offsets[i] + offsets[row + 1] - offsets[row]
    out = np.empty(out_offsets[-1], dtype=values.dtype)
    for i in range(order.shape[0]):
        row = order[i]
        start = offsets[row]
        out[out_offsets[i] : out_offsets[i + 1]] = values[start : offsets[row + 1]]
    return out, out_offsets


@njit
def _pack_blocks(
    values: NDArray[np.generic],
    offsets: NDArray[np.int64],
    doc_rows: NDArray[np.int64],
    block_docs: NDArray[np.int64],
    first_offsets: NDArray[np.int64],
    seq_len: int,
    eos_id: int,
    pad_id: int,
    ignore: int,
) -> PackedArrays:
    """Blocks of `seq_len` tokens from documents, each followed by `eos_id`: all four int64
    fields (the default batch). Returns (input_ids, labels, position_ids, document_ids,
    piece_starts, block_pieces); see `_pack_into` for each."""
    blocks = block_docs.shape[0] - 1
    ids = np.empty((blocks, seq_len), dtype=np.int64)
    labels = np.empty((blocks, seq_len), dtype=np.int64)
    positions = np.empty((blocks, seq_len), dtype=np.int64)
    documents = np.empty((blocks, seq_len), dtype=np.int64)
    piece_starts, block_pieces = _pack_into(
        values, offsets, doc_rows, block_docs, first_offsets, seq_len, eos_id, pad_id, ignore,
        ids, labels, positions, documents,
    )  # fmt: skip
    return ids, labels, positions, documents, piece_starts, block_pieces


@njit
def _pack_into(
    values: NDArray[np.generic],
    offsets: NDArray[np.int64],
    doc_rows: NDArray[np.int64],
    block_docs: NDArray[np.int64],
    first_offsets: NDArray[np.int64],
    seq_len: int,
    eos_id: int,
    pad_id: int,
    ignore: int,
    ids: NDArray[np.integer],
    labels: NDArray[np.integer],
    positions: NDArray[np.integer],
    documents: NDArray[np.integer],
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Blocks of `seq_len` tokens from documents, each followed by `eos_id`, in one pass,
    written into the (blocks, seq_len) arrays given; an empty (0, 0) `labels`, `positions`
    or `documents` is not written (a narrow batch pays only for the fields it holds).

    Block b holds documents `doc_rows[block_docs[b]:block_docs[b + 1]]` (rows of the ragged
    array (values, offsets)), starting `first_offsets[b]` tokens into the first; what is
    left after them is `pad_id`. `ids` gets the tokens; labels are the next token inside a
    document piece, else `ignore`; positions count from 0 at each document start and at the
    block's start; document ids number the documents inside the block, -1 on padding.
    Returns (piece_starts, block_pieces): `piece_starts[block_pieces[b]:block_pieces[b + 1]]`
    are where block b's document pieces (and its padding, one piece) start, as indices into
    the flattened blocks: the makings of `cu_seqlens` without another pass. Pieces are
    copied as slices.
    """
    blocks = block_docs.shape[0] - 1
    with_labels, with_positions = labels.size > 0, positions.size > 0
    with_documents = documents.size > 0
    piece_starts = np.empty(block_docs[-1] + blocks, dtype=np.int64)  # <= docs + 1 a block
    block_pieces = np.empty(blocks + 1, dtype=np.int64)
    pieces = 0
    for b in range(blocks):
        block_pieces[b] = pieces
        filled = 0
        skip = first_offsets[b]
        for j in range(block_docs[b], block_docs[b + 1]):
            row = doc_rows[j]
            start = offsets[row] + skip
            real = offsets[row + 1] - start  # tokens of the document left, eos excluded
            take = min(real + 1, seq_len - filled)
            skip = 0
            if take <= 0:
                continue
            piece_starts[pieces] = b * seq_len + filled
            pieces += 1
            copied = min(real, take)
            ids[b, filled : filled + copied] = values[start : start + copied]
            if copied < take:
                ids[b, filled + copied] = eos_id
            end = filled + take - 1
            if with_labels:
                labels[b, filled:end] = ids[b, filled + 1 : end + 1]
                labels[b, end] = ignore
            if with_positions:
                for k in range(take):
                    positions[b, filled + k] = k
            if with_documents:
                documents[b, filled : end + 1] = j - block_docs[b]
            filled += take
        if filled < seq_len:
            piece_starts[pieces] = b * seq_len + filled
            pieces += 1
            ids[b, filled:] = pad_id
            if with_labels:
                labels[b, filled:] = ignore
            if with_positions:
                positions[b, filled:] = 0
            if with_documents:
                documents[b, filled:] = -1
    block_pieces[blocks] = pieces
    return piece_starts, block_pieces


@njit
def _batch_cu_seqlens(
    piece_starts: NDArray[np.int64],
    block_pieces: NDArray[np.int64],
    bounds: NDArray[np.int64],
    seq_len: int,
) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """`cu_seqlens` of every batch of a read, back to back: batch i (blocks [bounds[i],
    bounds[i + 1])) gets `out[firsts[i]:firsts[i + 1]]`, the starts of its document pieces
    (`_pack_into`'s piece starts, less the batch's first token) and its token count last.
    One pass in the read thread, so handing out a batch is a slice (the NumPy twin:
    `loader.read.packed_reader.cu_seqlens`, batch by batch)."""
    batches = bounds.shape[0] - 1
    firsts = np.empty(batches + 1, dtype=np.int64)
    firsts[0] = 0
    for i in range(batches):
        firsts[i + 1] = firsts[i] + block_pieces[bounds[i + 1]] - block_pieces[bounds[i]] + 1
    out = np.empty(firsts[batches], dtype=np.int32)
    for i in range(batches):
        a, b = bounds[i], bounds[i + 1]
        base, k = a * seq_len, firsts[i]
        for piece in range(block_pieces[a], block_pieces[b]):
            out[k] = piece_starts[piece] - base
            k += 1
        out[k] = (b - a) * seq_len
    return out, firsts


@njit
def _sample_index(
    prefix: NDArray[np.int64], seq_len: int, blocks: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The epoch's sample index (as Megatron's GPT dataset keeps one): for split s and block
    edge k in [0, blocks], the document where token k * seq_len of the split lies and how
    many tokens into it that is. `prefix[s, d]`: tokens (eos included) of split s before
    document d, strictly increasing; past the split's last token the document is L (the
    split's length) and the offset counts tokens past its end. One walk per split, O(L + B).
    """
    splits, length = prefix.shape[0], prefix.shape[1] - 1
    docs = np.empty((splits, blocks + 1), dtype=np.int64)
    offsets = np.empty((splits, blocks + 1), dtype=np.int64)
    for s in range(splits):
        doc = 0
        for k in range(blocks + 1):
            token = k * seq_len
            while doc < length and prefix[s, doc + 1] <= token:
                doc += 1
            docs[s, k] = doc
            offsets[s, k] = token - prefix[s, doc]
    return docs, offsets
