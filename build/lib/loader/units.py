"""What a split's cursor counts: rows, or packed blocks of tokens. One strategy per kind.

The stream, the cursors, the layouts and the state's position are the same for both: they
count units. What differs is small and lives here: how many units a split holds in an
epoch, what reads them, what the plan's identity adds, how unit cursors are written into a
state and read back, and what telemetry says about them. The dataset holds one `Units`
and never asks which kind it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loader import state as st
from loader.packing import PackedTokens, PackSpec, blocks_of_state, packing_state, token_lengths
from loader.plan import PlanSpec
from loader.read.reader import BatchReader, OnError
from loader.sources import ResolvedSource


class Units(Protocol):
    """One kind of unit, bound to a pinned source and its plan."""

    plan: PlanSpec
    reader: Any  # reads BatchTasks: BatchReader or PackedReader

    @property
    def tokens_per_unit(self) -> int | None:
        """A packed block's seq_len; None for rows."""
        ...

    @property
    def field_bytes(self) -> int:
        """Bytes a token takes in a packed batch's fields (what sizes a read); 0 for rows."""
        ...

    def per_split(self, epoch: int) -> int:
        """What a split's cursor counts up to in `epoch` (L rows, or the epoch's blocks)."""
        ...

    def to_state(self, epoch: int, cursors: list[int]) -> tuple[list[int], dict[str, Any]]:
        """Unit cursors as the state stores them, and the state's extra fields."""
        ...

    def from_state(self, state: dict[str, Any]) -> list[int]:
        """The unit cursors a (checked) state stands for: O(S)."""
        ...

    def progress_facts(self, units_read: int, epoch: int) -> dict[str, int]:
        """What telemetry adds about `units_read` units of this rank's splits."""
        ...


@dataclass
class RowUnits:
    """A split's unit is one row: L = N // S of them in every epoch."""

    plan: PlanSpec
    reader: BatchReader

    @property
    def tokens_per_unit(self) -> int | None:
        return None

    @property
    def field_bytes(self) -> int:
        return 0

    def per_split(self, epoch: int) -> int:
        return self.plan.rows_per_split

    def to_state(self, epoch: int, cursors: list[int]) -> tuple[list[int], dict[str, Any]]:
        return cursors, {}

    def from_state(self, state: dict[str, Any]) -> list[int]:
        return list(state[st.KEY_CURSORS])

    def progress_facts(self, units_read: int, epoch: int) -> dict[str, int]:
        return {}


@dataclass
class BlockUnits:
    """A split's unit is a block of `seq_len` tokens cut from its documents (`packing.py`);
    the state stores (document, token offset) cursors, which mean the same whatever the
    epoch's block count."""

    plan: PlanSpec
    reader: Any
    packing: PackedTokens

    @property
    def tokens_per_unit(self) -> int | None:
        return self.packing.spec.seq_len

    @property
    def field_bytes(self) -> int:
        return self.packing.spec.field_bytes

    def per_split(self, epoch: int) -> int:
        return self.packing.blocks_per_split(epoch)

    def to_state(self, epoch: int, cursors: list[int]) -> tuple[list[int], dict[str, Any]]:
        return packing_state(self.packing.epoch(epoch), cursors)

    def from_state(self, state: dict[str, Any]) -> list[int]:
        blocks = self.packing.epoch(state[st.KEY_EPOCH])
        return blocks_of_state(blocks, state, state[st.KEY_CURSORS])

    def progress_facts(self, units_read: int, epoch: int) -> dict[str, int]:
        """Tokens of the blocks handed out (exact, a short last batch included), and what
        the cursors count up to, for the dashboard."""
        tokens = units_read * self.packing.spec.seq_len
        return {"tokens": tokens, "blocks_per_split": self.per_split(epoch)}


@dataclass(frozen=True)
class UnitRequest:
    """The constructor's choice of unit, before a source is pinned: rows, or packing."""

    pack: PackSpec | None
    transform: Callable[[dict[str, Any]], Any] | None
    on_error: OnError

    def identity(self) -> dict[str, Any]:
        """What the plan's identity adds (the packing keywords)."""
        return self.pack.identity() if self.pack is not None else {}

    def bind(self, resolved: ResolvedSource, plan: PlanSpec, lengths: Any = None) -> Units:
        """The units of `plan` on the pinned `resolved` source (packing reads the token
        lengths once per version, unless `lengths` are the same version's already)."""
        if self.pack is None:
            return RowUnits(plan, BatchReader(resolved, plan, self.transform, self.on_error))
        from loader.read.packed_reader import PackedReader

        if lengths is None:  # the one-off pass, per version
            lengths = token_lengths(resolved, self.pack.column, self.pack.dtype)
        packing = PackedTokens(self.pack, plan, lengths)
        return BlockUnits(plan, PackedReader(resolved, plan, packing), packing)
