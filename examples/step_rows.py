"""A small run to ask "which rows were in step T?" about (the README's `elastic-loader rows`).

Writes a LanceDB table of 2,400 documents (`doc_id` "doc-00000" ...) to `data/`, reads 4
global steps of 240 rows on 3 ranks (S = 8, simulated in one process), and saves the
state to `checkpoints/step_rows.json`. Then:

    python examples/step_rows.py
    elastic-loader rows checkpoints/ --step 6 --id-column doc_id
"""

from pathlib import Path

import lancedb
import pyarrow as pa

from loader import StreamingDataLoader, StreamingDataset, checkpoint

ROWS, SPLITS, WORLD, GLOBAL_BATCH, STEPS = 2400, 8, 3, 240, 4


def main() -> None:
    db = lancedb.connect("data/docs.lancedb")
    docs = pa.table({"doc_id": [f"doc-{i:05d}" for i in range(ROWS)], "length": range(ROWS)})
    table = db.create_table("docs", docs, mode="overwrite")
    loaders = [
        StreamingDataLoader(
            StreamingDataset(table, num_splits=SPLITS, shuffle_seed=7, rank=r, world_size=WORLD),
            global_batch_size=GLOBAL_BATCH,
        )
        for r in range(WORLD)
    ]
    streams = [iter(dl) for dl in loaders]
    for _ in range(STEPS):
        for stream in streams:
            next(stream)
    path = checkpoint.save(loaders[0].state_dict(), Path("checkpoints") / "step_rows.json")
    print(f"saved {path} at global step {loaders[0].global_step}")


if __name__ == "__main__":
    main()
