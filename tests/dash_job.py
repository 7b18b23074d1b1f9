"""One-rank training jobs for the browser test: `python -m tests.dash_job MODE DIR API RUN`.

- `crash`: reads 7 batches with telemetry on, saves a checkpoint the way the README shows
  (`checkpoint.save(dl.state_dict(), path)`, no other call), reads 3 more, writes
  `DIR/ready`, then keeps training at a step every 0.5 s until the test SIGKILLs it: a crash
  with no `close()` and no exit handler.
- `finish`: states `total_epochs=1`, reads the whole epoch of a packed token table (blocks of
  `SEQ_LEN` tokens, so the page shows tokens) and exits normally (the client's exit handler
  sends `closed`).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

from loader import StreamingDataLoader, StreamingDataset, checkpoint

SAVED_AT, BATCH, SEQ_LEN = 7, 8, 8


def main(mode: str, folder: str, api: str, run_id: str) -> None:
    db = lancedb.connect(str(Path(folder, f"lance-{mode}")))
    if mode == "finish":
        docs = pa.array([[d + 1] * (1 + d % 13) for d in range(1000)], pa.list_(pa.int32()))
        table = db.create_table("docs", pa.table({"tokens": docs}))
        ds = StreamingDataset(
            table, columns=["tokens"], num_splits=8, shuffle_seed=1, pack_sequences=SEQ_LEN,
            eos_id=0,
        )  # fmt: skip
        dl = StreamingDataLoader(ds, batch_size=BATCH, telemetry=api, run_id=run_id, total_epochs=1)
        for _ in dl:
            pass
        return
    table = db.create_table("rows", pa.table({"id": np.arange(4000, dtype=np.int64)}))
    ds = StreamingDataset(table, num_splits=8, shuffle_seed=1)
    dl = StreamingDataLoader(ds, batch_size=BATCH, telemetry=api, run_id=run_id)
    it = iter(dl)
    for _ in range(SAVED_AT):
        next(it)
    checkpoint.save(dl.state_dict(), Path(folder, f"step-{SAVED_AT:06d}.json"))
    for _ in range(3):
        next(it)
    Path(folder, "ready").touch()
    pace = threading.Event()
    for _ in it:  # keeps training, a step every 0.5 s: a run that stops stepping reads stalled
        pace.wait(0.5)
    pace.wait()  # until SIGKILL


if __name__ == "__main__":
    main(*sys.argv[1:5])
