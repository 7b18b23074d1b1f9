"""Reading packed blocks: task → (split, block) pairs → the documents they cover → one read.

A block is a slice of its split's token stream: `searchsorted` on the split's prefix sums
finds its documents, every document any block of the task needs is read once (one sorted
read), and a kernel copies the tokens into place. Nothing is carried between tasks, so a
worker or a resumed rank reads block t without reading what came before.

A batch is a dict of (B, seq_len) int64 tensors and one int32 vector:
- `input_ids`: the tokens; `pad_id` after a split's last token (only with blocks_per_epoch).
- `labels`: the next token, already shifted (the model must not shift again): labels[:, i]
  is input_ids[:, i + 1] where both are in the same document, else -100 (the position
  before a document starts, i.e. its eos, the block's last position, and padding).
- `position_ids`: 0 at each document's start and at the block's start.
- `document_ids`: which document of the block each token is in (0, 1, ...; -1 on padding).
- `cu_seqlens`: int32 boundaries of the document pieces in the flattened (B * seq_len)
  batch, as FlashAttention's varlen functions take them (padding is one piece of its own).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from loader.convert import ragged_parts
from loader.kernels.ragged import PackedArrays, _pack_blocks
from loader.packing import EpochBlocks, PackedTokens
from loader.plan import PlanSpec
from loader.reader import BatchReader
from loader.sources import ResolvedSource
from loader.stream import BatchTask, task_order_indices

IGNORE_INDEX = -100  # what torch's cross_entropy ignores by default


def block_documents(
    blocks: EpochBlocks, splits: NDArray[np.int64], levels: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """For blocks (split, level): the documents each covers, as split-local order indices.

    Returns (documents, block_docs, first_offsets): block i covers documents
    `documents[block_docs[i]:block_docs[i + 1]]` (indices into the epoch order) and starts
    `first_offsets[i]` tokens into the first.
    """
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


def cu_seqlens(
    piece_starts: NDArray[np.int64], block_pieces: NDArray[np.int64], a: int, b: int, seq_len: int
) -> NDArray[np.int32]:
    """Start of every document piece in the flattened batch of blocks [a, b), and its
    total length, from the kernel's piece starts (indices into all the task's blocks)."""
    first, last = block_pieces[a], block_pieces[b]
    out = np.empty(last - first + 1, dtype=np.int32)
    np.subtract(piece_starts[first:last], a * seq_len, out=out[:-1], casting="unsafe")
    out[-1] = (b - a) * seq_len
    return out


Fields = tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]


def packed_batch(fields: Fields, cu: NDArray[np.int32]) -> dict[str, torch.Tensor]:
    ids, labels, positions, documents = fields
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions),
        "document_ids": torch.from_numpy(documents),
        "cu_seqlens": torch.from_numpy(cu),
    }


class PackedReader(BatchReader):
    """A BatchReader whose units are packed blocks instead of rows."""

    def __init__(
        self,
        source: ResolvedSource,
        plan: PlanSpec,
        packing: PackedTokens,
    ) -> None:
        super().__init__(source, plan, None, "raise")
        self.packing = packing

    def blocks(self, task: BatchTask, sub_reads: int = 1) -> PackedArrays:
        """(input_ids, labels, position_ids, document_ids) of the task's blocks, in stream
        order, and the piece starts that make `cu_seqlens` (see `_pack_blocks`)."""
        spec = self.packing.spec
        layout = self.packing.epoch(task.epoch)
        per_split = layout.blocks_per_split
        order_idx = task_order_indices(task, per_split)
        splits, levels = np.divmod(order_idx, per_split)
        documents, block_docs, first_offsets = block_documents(layout, splits, levels)
        unique, doc_rows = np.unique(documents, return_inverse=True)
        if len(unique):
            positions = self._plan_of(task.epoch).order(unique)
            rows = self.source.rows
            table, restore = self.read(positions if rows is None else rows[positions], sub_reads)
            column = table.column(spec.column)
            # one chunk (one sub-read) is read as is: combine_chunks would copy it
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
            values, offsets = ragged_parts(column)
            doc_rows = restore[doc_rows.reshape(-1)]
        else:  # only padding blocks
            values, offsets = np.empty(0, np.int64), np.zeros(1, np.int64)
        pad = spec.pad_id if spec.pad_id is not None else spec.eos_id
        return _pack_blocks(
            values,
            offsets,
            np.ascontiguousarray(doc_rows, dtype=np.int64),
            block_docs,
            first_offsets,
            spec.seq_len,
            spec.eos_id,
            pad,
            IGNORE_INDEX,
        )

    def batches(self, task: BatchTask, sub_reads: int = 1) -> list[Any]:
        """The task's batches of blocks, from one read (in up to `sub_reads` parts at once)."""
        *fields, piece_starts, block_pieces = self.blocks(task, sub_reads)
        bounds = np.cumsum((0, *task.sizes)).tolist()
        seq_len = self.packing.spec.seq_len
        batches = [
            packed_batch(
                (fields[0][a:b], fields[1][a:b], fields[2][a:b], fields[3][a:b]),
                cu_seqlens(piece_starts, block_pieces, a, b, seq_len),
            )
            for a, b in itertools.pairwise(bounds)
        ]
        return batches
