"""Which rows trained the model, per epoch: the evidence behind "each row exactly once".

The loader promises that an epoch hands every row to the training loop once, across
crashes and world-size changes. This ledger checks the promise from the outside, on
the rows the model actually learned from: the ranks count the ``row_id`` of every batch
they train on, and the counts are summed over ranks only when a checkpoint is written.
It costs one int32 per row and epoch (7,352 x 5 here), fine for a demonstration and a
test; a real job would not carry it. ``train_ddp.py`` and ``fsdp2_dcp.py`` keep one; run
this file to see one kept across a crash (one rank, in one process):

    python examples/row_ledger.py
"""

from __future__ import annotations

import pyarrow as pa
import torch
import torch.distributed as dist

from loader import StreamingDataLoader, StreamingDataset


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


def demo_loader(table: pa.Table, state: dict | None = None) -> StreamingDataLoader:
    dl = StreamingDataLoader(StreamingDataset(table, num_splits=4, shuffle_seed=0), batch_size=10)
    if state is not None:
        dl.load_state_dict(state)
    return dl


def main() -> None:
    """Checkpoint after 4 steps, read 2 more, crash, resume: the ledger counts each row once."""
    print(__doc__.split("\n\n")[0])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        table, cpu = pa.table({"row_id": range(100)}), torch.device("cpu")
        ledger, dl = RowLedger(epochs=1, num_rows=100), demo_loader(table)
        batches = iter(dl)
        for _ in range(4):
            ledger.add(0, next(batches)["row_id"])
        ledger.commit(cpu)
        saved = (ledger.committed.clone(), dl.state_dict())  # the checkpoint
        for _ in range(2):
            ledger.add(0, next(batches)["row_id"])  # read and trained on, then the crash
        resumed, dl = RowLedger(epochs=1, num_rows=100), demo_loader(table, saved[1])
        resumed.committed.copy_(saved[0])
        for batch in dl:
            resumed.add(0, batch["row_id"])
        resumed.commit(cpu)
        print("4 steps, a checkpoint, 2 more steps, a crash, a resume from the checkpoint:")
        for e in resumed.summary():
            print(f"  epoch {e['epoch']}: {e['rows']} rows trained, {e['distinct']} distinct, "
                  f"each {e['min']}-{e['max']} time(s)")  # fmt: skip
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
