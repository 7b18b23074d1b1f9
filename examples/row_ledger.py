"""Which rows trained the model, per epoch: the evidence behind "each row exactly once".

The loader promises that an epoch hands every row to the training loop once, across
crashes and world-size changes. This ledger checks the promise from the outside, on
the rows the model actually learned from: the ranks count the ``row_id`` of every batch
they train on, and the counts are summed over ranks only when a checkpoint is written.
It costs one int32 per row and epoch (7,352 x 5 here), fine for a demonstration and a
test; a real job would not carry it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class RowLedger:
    """How many times each row trained the model, per epoch.

    Counts since the last checkpoint stay local; ``commit`` sums them over ranks into the
    committed table, which is what a checkpoint stores. Rows read after the last
    checkpoint by a job that then crashes are never committed: the resumed job reads them
    again, and the committed table shows each row once.
    """

    def __init__(self, epochs: int, num_rows: int) -> None:
        self.committed = torch.zeros(epochs, num_rows, dtype=torch.int32)
        self.pending = torch.zeros_like(self.committed)

    def add(self, epoch: int, row_ids: torch.Tensor) -> None:
        ids = row_ids.cpu()
        self.pending[epoch].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def commit(self, device: torch.device) -> None:
        pending = self.pending.to(device)
        dist.all_reduce(pending)
        self.committed += pending.cpu()
        self.pending.zero_()

    def summary(self) -> list[dict[str, int]]:
        """Per epoch: rows used, distinct rows, and the least and most any row was used."""
        return [
            {
                "epoch": epoch,
                "rows": int(counts.sum()),
                "distinct": int((counts > 0).sum()),
                "min": int(counts.min()),
                "max": int(counts.max()),
            }
            for epoch, counts in enumerate(self.committed)
        ]
