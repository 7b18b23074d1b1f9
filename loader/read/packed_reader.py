"""Reading packed blocks: task → (split, block) pairs → the documents they cover → one read.

A block is a slice of its split's token stream: `searchsorted` on the split's prefix sums
finds its documents, every document any block of the task needs is read once (one sorted
read), and a kernel copies the tokens into place. Nothing is carried between tasks, so a
worker or a resumed rank reads block t without reading what came before.

A batch is a dict of (B, seq_len) int64 tensors and one int32 vector (fewer fields, or
int32 ones, with `pack_fields`/`pack_dtype`: `loader/packed_batch.py`):
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
import os
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from numpy.typing import NDArray
from torch.utils.data import get_worker_info

from loader.kernels.ragged import _batch_cu_seqlens, _pack_into
from loader.packed_batch import IGNORE_INDEX
from loader.packing import EpochBlocks, PackedTokens, PackSpec
from loader.plan import PlanSpec
from loader.read.clumps import Docs, ReadUnits, UnitCache, gather, read_units, split_units
from loader.read.convert import ragged_parts, single_array
from loader.read.reader import BatchReader, SlicedRead
from loader.sources import ResolvedSource
from loader.storage import is_object_store
from loader.stream import BatchTask, task_order_indices

__all__ = ["IGNORE_INDEX", "PackedReader", "block_documents", "cu_seqlens"]
ARRAY_FIELDS = ("input_ids", "labels", "position_ids", "document_ids")  # the kernel's four


def block_documents(
    blocks: EpochBlocks, splits: NDArray[np.int64], levels: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """For blocks (split, level): the documents each covers, as split-local order indices.

    Returns (documents, block_docs, first_offsets): block i covers documents
    `documents[block_docs[i]:block_docs[i + 1]]` (indices into the epoch order) and starts
    `first_offsets[i]` tokens into the first. Lookups in the epoch's sample index: block k
    starts at its edge k and ends before the document of edge k + 1 (or in it, when that
    edge is inside a document).
    """
    length = blocks.prefix.shape[1] - 1
    edge_docs, edge_offsets = blocks.sample_index
    first = edge_docs[splits, levels]
    after = edge_docs[splits, levels + 1]
    last = after + ((edge_offsets[splits, levels + 1] > 0) & (after < length))
    counts = last - first
    block_docs = np.zeros(len(splits) + 1, dtype=np.int64)
    np.cumsum(counts, out=block_docs[1:])
    base = splits * length + first - block_docs[:-1]
    documents = np.repeat(base, counts) + np.arange(block_docs[-1], dtype=np.int64)
    first_offsets = np.where(first < length, edge_offsets[splits, levels], 0)
    return documents, block_docs, first_offsets


def cu_seqlens(
    piece_starts: NDArray[np.int64], block_pieces: NDArray[np.int64], a: int, b: int, seq_len: int
) -> NDArray[np.int32]:
    """Start of every document piece in the flattened batch of blocks [a, b), and its
    total length, from the kernel's piece starts (indices into all the task's blocks).
    The NumPy twin of `_batch_cu_seqlens`, one batch at a time (tests compare the two)."""
    first, last = block_pieces[a], block_pieces[b]
    out = np.empty(last - first + 1, dtype=np.int32)
    np.subtract(piece_starts[first:last], a * seq_len, out=out[:-1], casting="unsafe")
    out[-1] = (b - a) * seq_len
    return out


# a read's fields (name -> (blocks, seq_len) tensor) and, when the batch holds cu_seqlens,
# every batch's made in the read (`_batch_cu_seqlens`: the values, and (a, b) -> their span)
PackedWhole = tuple[
    dict[str, torch.Tensor], NDArray[np.int32] | None, dict[tuple[int, int], tuple[int, int]]
]


def cut_blocks(whole: PackedWhole, a: int, b: int) -> dict[str, torch.Tensor]:
    """Blocks [a, b) of a read: views of its fields, and their `cu_seqlens` (a slice of the
    read's, made beside the fields in the read thread: the batch's hand-out stays views)."""
    fields, cu, spans = whole
    out = {name: field[a:b] for name, field in fields.items()}
    if cu is not None:
        first, last = spans[a, b]
        out["cu_seqlens"] = torch.from_numpy(cu[first:last])
    return out


# what `pack` returns: field names, their (fields, blocks, seq_len) array, the piece starts
Packed = tuple[tuple[str, ...], NDArray[Any], NDArray[np.int64], NDArray[np.int64]]


def pack(
    spec: PackSpec,
    values: NDArray[Any],
    offsets: NDArray[np.int64],
    doc_rows: NDArray[np.int64],
    block_docs: NDArray[np.int64],
    first_offsets: NDArray[np.int64],
) -> Packed:
    """The kernel writing only the fields `spec` keeps, in its dtype: (the fields' names, all
    of them in one (fields, blocks, seq_len) array, piece starts, block pieces). One
    allocation: one storage a read for a worker to hand on (as rows), and on fresh memory
    NumPy's huge pages for 4 MiB or more (~20 page faults instead of ~2,000 for four (128,
    2048) int64 fields: the kernel alone ran 13x faster; in the loader, where freed reads are
    reused, it measured the same)."""
    kept = [name for name in ARRAY_FIELDS if name in spec.fields]
    whole = np.empty((len(kept), len(block_docs) - 1, spec.seq_len), dtype=spec.dtype)
    views = dict(zip(kept, whole, strict=True))
    none = np.empty((0, 0), dtype=spec.dtype)
    arrays = [views.get(name, none) for name in ARRAY_FIELDS]
    pad = spec.pad_id if spec.pad_id is not None else spec.eos_id
    piece_starts, block_pieces = _pack_into(
        values, offsets, doc_rows, block_docs, first_offsets, spec.seq_len, spec.eos_id, pad,
        IGNORE_INDEX, *arrays,
    )  # fmt: skip
    return tuple(kept), whole, piece_starts, block_pieces


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
        uri = source.spec.uri
        # whole-unit reads pay where a read is requests (measured ~4x at S=4, ~20x at S=48 on
        # a local S3 server); from a local file a sorted take of the same runs is as fast
        self.unit_reads = is_object_store(uri) and not uri.startswith("memory://")
        self._mean_tokens: float | None = None
        self._cache: UnitCache | None = None
        self._cache_pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_cache"], state["_cache_pid"] = None, -1  # a lock and read data stay here
        return state

    def blocks(self, task: BatchTask, sub_reads: int = 1) -> Packed:
        """The fields the spec keeps of the task's blocks, in stream order, and the piece
        starts that make `cu_seqlens` (see `pack` and `_pack_into`)."""
        spec = self.packing.spec
        layout = self.packing.epoch(task.epoch)
        per_split = layout.blocks_per_split
        order_idx = task_order_indices(task, per_split)
        splits, levels = np.divmod(order_idx, per_split)
        documents, block_docs, first_offsets = block_documents(layout, splits, levels)
        unique, doc_rows = np.unique(documents, return_inverse=True)
        if len(unique):
            positions = self._plan_of(task.epoch).order(unique)
            # the kernel gets the documents in ascending position order either way
            restore = np.empty(len(positions), dtype=np.int64)
            ascending = np.argsort(positions, kind="stable")
            restore[ascending] = np.arange(len(positions))
            units = self._units_for(task)
            if units is None:
                values, offsets = self._documents(positions[ascending], sub_reads)
            else:
                values, offsets = self._from_units(units, positions[ascending], task, sub_reads)
            doc_rows = restore[doc_rows.reshape(-1)]
        else:  # only padding blocks
            values, offsets = np.empty(0, np.int64), np.zeros(1, np.int64)
        rows = np.ascontiguousarray(doc_rows, dtype=np.int64)
        return pack(spec, values, offsets, rows, block_docs, first_offsets)

    def _column(self, rows: NDArray[np.int64], sub_reads: int) -> pa.Array:
        """The token column at ascending table rows, read in up to `sub_reads` parts."""
        table, _ = self.read(rows, sub_reads)  # ascending already: the order is kept
        return single_array(table.column(self.packing.spec.column))

    def _documents(self, positions: NDArray[np.int64], sub_reads: int) -> Docs:
        """Exactly the documents at ascending plan positions: one sorted take."""
        rows = self.source.rows
        return ragged_parts(self._column(positions if rows is None else rows[positions], sub_reads))

    def _units_for(self, task: BatchTask) -> ReadUnits | None:
        """The read units when whole-unit reads pay for this task in this process, else None."""
        splits = task.split_count
        if not self.unit_reads:
            return None
        if self._mean_tokens is None:
            self._mean_tokens = float(self.packing.lengths.mean()) + 1  # + eos
        plan = self.plan
        units = read_units(plan.clump_size, plan.num_rows, self._mean_tokens, splits, plan.shuffle)
        info = get_worker_info()
        workers = info.num_workers if info is not None else 1
        task_tokens = task.count * self.packing.spec.seq_len
        if units is None or not units.pays(self._mean_tokens, splits, task_tokens, workers):
            return None
        return units

    def _from_units(
        self, units: ReadUnits, positions: NDArray[np.int64], task: BatchTask, sub_reads: int
    ) -> Docs:
        """The documents at ascending plan positions, from whole units (read once each)."""
        if self._cache is None or self._cache_pid != os.getpid():  # a forked child starts empty
            self._cache, self._cache_pid = UnitCache(), os.getpid()
        wanted = np.unique(units.ids(positions)).tolist()

        def read(missing: list[int]) -> list[Docs]:
            spans = [units.span(unit) for unit in missing]
            plan_rows = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans])
            rows = self.source.rows
            column = self._column(plan_rows if rows is None else rows[plan_rows], sub_reads)
            values, offsets = ragged_parts(column)
            return split_units(values, offsets, [b - a for a, b in spans])

        capacity = 2 * task.split_count + 2
        loaded = dict(zip(wanted, self._cache.get(wanted, read, capacity), strict=True))
        return gather(units, positions, loaded)

    def batches(self, task: BatchTask, sub_reads: int = 1) -> SlicedRead:
        """The task's batches of blocks, from one read (in up to `sub_reads` parts at once)."""
        names, fields, piece_starts, block_pieces = self.blocks(task, sub_reads)
        storage = torch.from_numpy(fields)  # the fields stay views of one storage
        tensors = {name: storage[i] for i, name in enumerate(names)}
        bounds = np.cumsum((0, *task.sizes), dtype=np.int64)
        edges = bounds.tolist()
        cu, spans = None, {}
        if "cu_seqlens" in self.packing.spec.fields:
            seq_len = self.packing.spec.seq_len
            cu, firsts = _batch_cu_seqlens(piece_starts, block_pieces, bounds, seq_len)
            batches, pieces = itertools.pairwise(edges), itertools.pairwise(firsts.tolist())
            spans = dict(zip(batches, pieces, strict=True))
        return SlicedRead((tensors, cu, spans), edges, cut_blocks)
