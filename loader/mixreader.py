"""Reading a mixture's task: one read per (dataset, pass) through that dataset's own
reader, then each batch joined in layout order with the `source` of every row (or block)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from loader.convert import Ragged
from loader.mixstream import MixTask

SOURCE_FIELD = "source"  # the batch key holding each row's dataset index


class MixReader:
    """Reads a MixTask: one read per (dataset, pass) through that dataset's own reader, then
    each batch joined in layout order with its `source` tensor."""

    def __init__(self, readers: Sequence[Any]) -> None:
        self.readers = tuple(readers)

    def batches(self, task: MixTask, sub_reads: int = 1) -> list[Any]:
        parts = [self.readers[k].batches(t, sub_reads) for k, t in task.groups]
        out = []
        for items in task.layout:
            pieces = [parts[g][i] for g, i in items]
            sources = [task.groups[g][0] for g, _ in items]
            counts = [task.groups[g][1].sizes[i] for g, i in items]
            out.append(join_batches(pieces, sources, counts))
        return out

    def __getitem__(self, task: MixTask) -> list[Any]:
        return self.batches(task)


def join_batches(pieces: list[Any], sources: list[int], counts: list[int]) -> dict[str, Any]:
    """One batch from pieces of several datasets (same keys), plus the `source` of each row."""
    for piece in pieces:
        if not isinstance(piece, dict):
            raise TypeError(
                f"a mixture's datasets must give dict batches, got {type(piece).__name__}"
            )
        if piece.keys() != pieces[0].keys():
            raise ValueError(
                f"the datasets of a mixture must give the same columns: {sorted(pieces[0])} and "
                f"{sorted(piece)}; pass columns=[...] to each StreamingDataset"
            )
    out: dict[str, Any] = {}
    for key in pieces[0]:
        values = [p[key] for p in pieces]
        out[key] = values[0] if len(values) == 1 else _join(key, values)
    out[SOURCE_FIELD] = torch.repeat_interleave(torch.tensor(sources), torch.tensor(counts))
    return out


def _join(key: str, values: list[Any]) -> Any:
    if key == "cu_seqlens":  # packed: boundaries in each piece's flattened blocks
        shifted, total = [], 0
        for v in values:
            shifted.append(v[:-1] + total)
            total += int(v[-1])
        return torch.cat([*shifted, torch.tensor([total], dtype=values[0].dtype)])
    if isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    if isinstance(values[0], Ragged):
        starts = np.cumsum([0] + [int(v.offsets[-1]) for v in values[:-1]]).tolist()
        offsets = [values[0].offsets[:1]] + [
            v.offsets[1:] + s for v, s in zip(values, starts, strict=True)
        ]
        return Ragged(torch.cat([v.values for v in values]), torch.cat(offsets))
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    raise TypeError(f"column {key!r}: cannot join values of type {type(values[0]).__name__}")
