"""Token packing: each split's documents, in plan order, cut into blocks of `seq_len` tokens.

A split's token stream is its documents in plan order, each followed by `eos_id`. Block k
of split s is tokens [k*seq_len, (k+1)*seq_len) of that stream, so a block depends only on
the plan, never on W, workers or batch size. Blocks are the split's unit: the rank stream,
cursors and balancing of rows apply to them unchanged (`blocks_per_split` plays L).

Every split yields the same number of blocks B in an epoch:
- `blocks_per_epoch=None` (default): B = the fewest whole blocks any split holds; the
  tokens past B blocks of each split are dropped for this epoch and counted
  (`tokens_dropped`). No padding ever.
- `blocks_per_epoch=K` (as lancedb.streaming): B = K / S; a split that runs out pads its
  last blocks with `pad_id`; tokens past B blocks are dropped and counted.

Cost: one pass over the token column at construction (lengths of every document, 4 bytes
each, kept for the run), and per epoch the prefix sums of the lengths in plan order (8
bytes per document) and, where blocks are read, the sample index (16 bytes per block: the
document and offset where each block starts), each computed once per process and epoch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from loader import args
from loader.kernels.ragged import _sample_index
from loader.packed_batch import PACK_FIELDS, pack_dtype, pack_fields
from loader.plan import PlanSpec
from loader.sources import ResolvedSource, open_source
from loader.state import KEY_TOKEN_OFFSETS, KEY_TOKENS_DROPPED, PLAN_PACK_SEQUENCES

LENGTHS_READ_ROWS = 65_536  # rows per read of the one-off lengths pass
TOKEN_MAX = 2**63 - 1  # the largest id an int64 tensor holds
# shuffle_clump_size when packing and the user gives none: documents of a clump are read as
# one run (1.5-1.6x the tokens/s of single documents, docs/packing.md) and a clump of ~0.5M
# tokens is still finer than the chunk LitData shuffles (its blocks move within ~2-16M).
PACKED_CLUMP = 256
# ... but a table must still shuffle: the default clump leaves at least this many clumps
# (a table of 120 documents in clumps of 256 is one clump: shuffle=True read it in order)
PACKED_MIN_CLUMPS = 64


def packed_clump(num_rows: int) -> int:
    """The default clump of a packed plan over N documents: PACKED_CLUMP, or fewer so that
    there are at least PACKED_MIN_CLUMPS clumps to shuffle (1 below 128 documents)."""
    return max(1, min(PACKED_CLUMP, num_rows // PACKED_MIN_CLUMPS))


INT64 = np.dtype(np.int64)  # the default batch's dtype


@dataclass(frozen=True)
class PackSpec:
    """The packing keywords (names as lancedb.streaming), the token column, and what a
    batch holds (`fields`, `dtype`: the output only, so not in `identity`)."""

    seq_len: int
    eos_id: int
    column: str
    pad_id: int | None = None
    blocks_per_epoch: int | None = None
    fields: tuple[str, ...] = PACK_FIELDS
    dtype: np.dtype[Any] = INT64

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"pack_sequences must be an integer >= 1, got {self.seq_len!r}")
        if not isinstance(self.eos_id, int):
            raise ValueError(
                f"eos_id={self.eos_id!r}: pack_sequences needs an integer eos_id to put "
                f"between documents"
            )
        if self.blocks_per_epoch is not None:
            if self.blocks_per_epoch < 1:
                raise ValueError(f"blocks_per_epoch must be >= 1, got {self.blocks_per_epoch}")
            if self.pad_id is None:
                raise ValueError(
                    "blocks_per_epoch pads splits that run out of tokens: pass pad_id too"
                )

    @property
    def field_bytes(self) -> int:
        """Bytes a token takes in the batch's (B, seq_len) fields: 32 by default."""
        return self.dtype.itemsize * len([f for f in self.fields if f != "cu_seqlens"])

    def identity(self) -> dict[str, Any]:
        """What a resume must match (stored in the state's plan): not the output's fields
        or dtype, so a run may narrow its batches at a resume."""
        return {
            PLAN_PACK_SEQUENCES: self.seq_len,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "blocks_per_epoch": self.blocks_per_epoch,
            "token_column": self.column,
        }


def pack_spec(
    pack_sequences: int | None,
    eos_id: int | None,
    pad_id: int | None,
    blocks_per_epoch: int | None,
    columns: list[str] | None,
    num_splits: int,
    fields: Any = None,
    dtype: Any = "int64",
) -> PackSpec | None:
    """The checked packing keywords, or None when not packing."""
    if pack_sequences is None:
        given = {
            "blocks_per_epoch": blocks_per_epoch is not None,
            "pack_fields": fields is not None,
        }
        given["pack_dtype"] = not (dtype is None or (isinstance(dtype, str) and dtype == "int64"))
        for name in (name for name, set_ in given.items() if set_):
            raise ValueError(f"{name} requires pack_sequences")
        return None
    if eos_id is None:
        raise ValueError("eos_id is required when pack_sequences is set")
    kept, ids = pack_fields(fields), pack_dtype(dtype)
    token_limit = int(np.iinfo(ids).max) + 1  # ids land in tensors of `pack_dtype`
    seq_len = args.integer("pack_sequences", pack_sequences, 1)
    narrow = "" if ids == np.int64 else f" (pack_dtype={ids.name})"
    eos = args.integer(f"eos_id{narrow}", eos_id, -token_limit, token_limit)
    pad = args.optional_integer(f"pad_id{narrow}", pad_id, -token_limit, token_limit)
    blocks = args.optional_integer("blocks_per_epoch", blocks_per_epoch, 1)
    if columns is None or len(columns) != 1:
        raise ValueError(
            f"pack_sequences needs columns= naming exactly one token column (a list of "
            f"integers), got columns={columns!r}"
        )
    if blocks is not None and blocks % num_splits:
        raise ValueError(f"blocks_per_epoch={blocks} must be divisible by num_splits={num_splits}")
    return PackSpec(seq_len, eos, columns[0], pad, blocks, kept, ids)


def _check_token_column(
    name: str, column: pa.ChunkedArray | pa.Array, dtype: np.dtype[Any]
) -> None:
    kind = column.type
    if not (pat.is_list(kind) or pat.is_large_list(kind)) or not pat.is_integer(kind.value_type):
        raise ValueError(
            f"pack_sequences needs column {name!r} to be a list of integers (token ids), "
            f"but it is {kind}"
        )
    if column.null_count:
        raise ValueError(
            f"token column {name!r} has {column.null_count} null document(s); use an empty "
            f"list, or exclude them with filter='{name} IS NOT NULL'"
        )
    check_token_values(name, pc.list_flatten(column), dtype)


def check_token_values(
    name: str, values: pa.ChunkedArray | pa.Array, dtype: np.dtype[Any] = INT64
) -> None:
    """Token ids land in int64 tensors: a null token (NumPy would make it a float NaN, then
    -2**63) or a uint64 id of 2**63 or more (it would wrap negative) is an error."""
    if values.null_count:
        raise ValueError(
            f"token column {name!r} has {values.null_count} null token(s) inside documents; "
            f"a token id cannot be null. Fill them in the table (e.g. with a real id), or "
            f"exclude those documents with filter="
        )
    if pat.is_uint64(values.type) and len(values):
        top = pc.max(values).as_py()
        if top is not None and top > TOKEN_MAX:
            raise ValueError(
                f"token column {name!r} (uint64) holds id {top}, above {TOKEN_MAX} (2**63 - "
                f"1), the largest an int64 input_ids tensor holds; store ids as int64/uint32 "
                f"or remap them below 2**63"
            )
    if dtype != np.int64 and len(values):
        _check_narrow(name, values, dtype)


def _check_narrow(name: str, values: pa.ChunkedArray | pa.Array, dtype: np.dtype[Any]) -> None:
    """With a narrower `pack_dtype`, every id must fit it (a wider column is checked by its
    min and max, once, in the lengths pass: nothing wraps silently later)."""
    bounds = np.iinfo(dtype)
    column = np.iinfo(values.type.to_pandas_dtype())
    if column.min >= bounds.min and column.max <= bounds.max:
        return
    low, high = (v.as_py() for v in pc.min_max(values).values())
    if low < bounds.min or high > bounds.max:
        raise ValueError(
            f"token column {name!r} ({values.type}) holds ids in [{low}, {high}], outside "
            f"pack_dtype={dtype.name}'s [{bounds.min}, {bounds.max}]; pass pack_dtype='int64' "
            f"or remap the ids"
        )


def token_lengths(
    source: ResolvedSource, column: str, dtype: np.dtype[Any] = INT64
) -> NDArray[np.int32]:
    """Tokens of every document, by plan position: the one-off pass over the column (its
    ids checked to fit `dtype`, the batch's)."""
    rows = open_source(source.spec)
    positions = source.rows if source.rows is not None else None
    out = np.empty(source.num_rows, dtype=np.int32)
    for start in range(0, source.num_rows, LENGTHS_READ_ROWS):
        stop = min(start + LENGTHS_READ_ROWS, source.num_rows)
        chunk = (
            np.arange(start, stop, dtype=np.int64) if positions is None else positions[start:stop]
        )
        tokens = rows.take(chunk).column(column)
        _check_token_column(column, tokens, dtype)
        out[start:stop] = pc.list_value_length(tokens).to_numpy(zero_copy_only=False)
    return out


@dataclass(frozen=True)
class EpochBlocks:
    """One epoch's blocks: per split, the token offset where each document starts."""

    prefix: NDArray[np.int64]  # (S, L + 1): tokens (with eos) of split s before document d
    seq_len: int
    blocks_per_split: int
    surplus_tokens: int = 0  # tokens (with eos) of the N - S*L documents in no split

    @property
    def num_splits(self) -> int:
        return int(self.prefix.shape[0])

    @cached_property
    def sample_index(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(documents, offsets), each (S, B + 1): where block edge k of split s lies (the
        document, split-local, and the tokens into it; see `_sample_index`). Computed once
        per epoch, so a read finds its blocks' documents by lookups, not searches."""
        return _sample_index(self.prefix, self.seq_len, self.blocks_per_split)

    @property
    def tokens_dropped(self) -> int:
        """Tokens (eos included) of this epoch's documents in no block: each split's tail
        past B blocks, and the surplus documents the plan leaves out of every split."""
        kept = np.minimum(self.prefix[:, -1], self.blocks_per_split * self.seq_len)
        return int((self.prefix[:, -1] - kept).sum()) + self.surplus_tokens

    def to_documents(self, blocks: list[int]) -> tuple[list[int], list[int]]:
        """Block cursors as (document cursor, token offset in that document) per split.

        Past a split's last token (padding blocks) the document cursor is L and the offset
        counts tokens past the end.
        """
        docs, offsets = [], []
        for split, block in enumerate(blocks):
            starts = self.prefix[split]
            token = block * self.seq_len
            doc = min(int(np.searchsorted(starts, token, side="right")) - 1, len(starts) - 1)
            docs.append(doc)
            offsets.append(token - int(starts[doc]))
        return docs, offsets

    def to_blocks(self, docs: list[int], offsets: list[Any]) -> list[int]:
        """The inverse of `to_documents`, with an error naming a split that is not on a block edge."""
        blocks = []
        for split, (doc, offset) in enumerate(zip(docs, offsets, strict=True)):
            starts = self.prefix[split]
            last = len(starts) - 1
            within = starts[doc + 1] - starts[doc] if doc < last else offset + 1
            if not isinstance(offset, int) or not 0 <= offset < within:
                raise ValueError(
                    f"loader state token_offsets[{split}]={offset!r} is outside document "
                    f"{doc} of split {split}; the state does not match this table"
                )
            token = int(starts[doc]) + offset
            block, rest = divmod(token, self.seq_len)
            if rest or block > self.blocks_per_split:
                raise ValueError(
                    f"loader state of split {split} (document {doc}, token offset {offset}) "
                    f"is not on a block edge of pack_sequences={self.seq_len}; the state does "
                    f"not match this table or packing"
                )
            blocks.append(block)
        return blocks


@dataclass
class PackedTokens:
    """A run's packing: the spec, the document lengths, and the per-epoch block layout."""

    spec: PackSpec
    plan: PlanSpec
    lengths: NDArray[np.int32]  # by plan position
    _epochs: dict[int, EpochBlocks] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_epochs"] = {}  # recomputed where needed: cheaper than pickling O(N) sums
        return state

    def epoch(self, epoch: int) -> EpochBlocks:
        """The blocks of `epoch` (cached; the prefix sums are O(N) once per process)."""
        if epoch not in self._epochs:
            if len(self._epochs) > 1:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = self._layout(epoch)
        return self._epochs[epoch]

    def _layout(self, epoch: int) -> EpochBlocks:
        splits, length = self.plan.num_splits, self.plan.rows_per_split
        plan = self.plan.epoch(epoch)
        order = plan.order_range(0, splits * length)
        surplus = plan.order_range(splits * length, self.plan.rows_dropped)
        surplus_tokens = int(self.lengths[surplus].astype(np.int64).sum()) + len(surplus)
        per_doc = self.lengths[order].astype(np.int64).reshape(splits, length) + 1  # + eos
        prefix = np.zeros((splits, length + 1), dtype=np.int64)
        np.cumsum(per_doc, axis=1, out=prefix[:, 1:])
        if self.spec.blocks_per_epoch is not None:
            blocks = self.spec.blocks_per_epoch // splits
        else:
            blocks = int(prefix[:, -1].min()) // self.spec.seq_len
            if blocks == 0:  # an empty epoch, said loudly (a state of it stays valid)
                warnings.warn(
                    f"pack_sequences={self.spec.seq_len} is longer than the "
                    f"{int(prefix[:, -1].min())} tokens of the smallest split in epoch {epoch}: "
                    f"this epoch yields no block. Lower pack_sequences or num_splits, or pass "
                    f"blocks_per_epoch and pad_id to pad",
                    stacklevel=2,
                )
        return EpochBlocks(prefix, self.spec.seq_len, blocks, surplus_tokens)

    def blocks_per_split(self, epoch: int) -> int:
        return self.epoch(epoch).blocks_per_split


def packing_state(blocks: EpochBlocks, cursors: list[int]) -> tuple[list[int], dict[str, Any]]:
    """Block cursors as the state holds them: document cursors, plus the extra keys."""
    docs, offsets = blocks.to_documents(cursors)
    return docs, {KEY_TOKEN_OFFSETS: offsets, KEY_TOKENS_DROPPED: blocks.tokens_dropped}


def blocks_of_state(blocks: EpochBlocks, state: dict[str, Any], docs: list[int]) -> list[int]:
    """The block cursors a packed state stands for (O(S)), or a clear error. (`check_state`
    checked the offsets' shape: one count per split.)"""
    return blocks.to_blocks(docs, state[KEY_TOKEN_OFFSETS])
