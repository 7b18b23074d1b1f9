"""The ledger of a packed run: which documents, and which of their tokens, each block of a
step was cut from. The blocks come from the same code the loader cuts them with
(`loader.packing` for an epoch's blocks, `loader.read.packed_reader.block_documents` for
the documents a block covers); this module only turns those into token ranges."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import state as st
from loader.packing import PackedTokens, PackSpec, blocks_of_state, token_lengths
from loader.plan import PlanSpec
from loader.tools.rows_base import Document

__all__ = ["block_cursors", "block_pieces", "packing_of"]


def packing_of(plan: dict[str, Any], spec: PlanSpec, opened: Any) -> PackedTokens:
    """A packed state's blocks: its packing keywords over the token column's lengths (one
    pass over that column of the opened source, as the loader makes at its start)."""
    pack = PackSpec(
        plan[st.PLAN_PACK_SEQUENCES],
        plan["eos_id"],
        plan["token_column"],
        plan.get("pad_id"),
        plan.get("blocks_per_epoch"),
    )
    return PackedTokens(pack, spec, token_lengths(opened, pack.column))


def block_cursors(packing: PackedTokens, state: dict[str, Any]) -> tuple[int, ...]:
    """A packed state's (document, token offset) cursors as block cursors."""
    blocks = packing.epoch(int(state[st.KEY_EPOCH]))
    return tuple(blocks_of_state(blocks, state, list(state[st.KEY_CURSORS])))


def block_pieces(
    packing: PackedTokens, opened: Any, epoch: int, idx: NDArray[np.int64]
) -> list[list[Document]]:
    """For blocks `idx` (split * blocks_per_split + block) of `epoch`: each block's pieces
    of documents, (table position, first token, stop token), in block order. Token t of a
    document is its t-th token; its eos is token len(document). A padding block has none."""
    from loader.read.packed_reader import block_documents  # torch: only for packed runs

    blocks = packing.epoch(epoch)
    per_split, seq_len = blocks.blocks_per_split, blocks.seq_len
    length = packing.plan.rows_per_split
    splits, levels = idx // max(per_split, 1), idx % max(per_split, 1)
    docs, block_docs, _ = block_documents(blocks, splits, levels)
    owner = np.repeat(np.arange(len(idx)), np.diff(block_docs))  # the block of each piece
    split, local = docs // length, docs % length
    begin, end = blocks.prefix[split, local], blocks.prefix[split, local + 1]
    block_start = levels[owner] * seq_len
    first = np.maximum(block_start, begin) - begin
    stop = np.minimum(block_start + seq_len, end) - begin
    positions = packing.plan.epoch(epoch).order(docs)
    if opened.rows is not None:  # a filter: plan positions index the filtered rows
        positions = opened.rows[positions]
    out: list[list[Document]] = [[] for _ in idx]
    pieces = zip(owner.tolist(), positions.tolist(), first.tolist(), stop.tolist(), strict=True)
    for b, p, a, z in pieces:
        out[b].append((p, a, z))
    return out
