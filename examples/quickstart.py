"""Quickstart: stop a 4-rank job mid-epoch, resume it on 3 ranks, lose and repeat nothing.

The ranks are simulated in one process by passing ``rank`` and ``world_size``; in a real
job they come from torch.distributed. The state is per split, not per rank, so a state
saved by rank 0 of 4 ranks resumes 3 ranks: with a global batch that is a multiple of
``num_splits``, any world size up to it works (3 ranks read 6, 5 and 5 rows a step).

    python examples/quickstart.py
"""

import tempfile
from pathlib import Path

import pyarrow as pa

from loader import StreamingDataLoader, StreamingDataset
from loader.checkpoint import load, save

TABLE = pa.table({"id": list(range(64))})


def ranks(world_size, state=None):
    """One loader per rank; a global batch of 16 rows a step, split among the ranks."""
    loaders = []
    for rank in range(world_size):
        ds = StreamingDataset(TABLE, num_splits=4, shuffle_seed=1, rank=rank, world_size=world_size)
        loaders.append(StreamingDataLoader(ds, global_batch_size=16))
        if state:
            loaders[-1].load_state_dict(state)
    return loaders


first = ranks(4)
streams = [iter(dl) for dl in first]
seen = [i for _ in range(2) for it in streams for i in next(it)["id"].tolist()]  # 2 steps
path = save(first[0].state_dict(), Path(tempfile.mkdtemp()) / "loader.json")
seen += [i for dl in ranks(3, load(path)) for batch in dl for i in batch["id"].tolist()]
assert sorted(seen) == list(range(64)), "a row was lost or repeated"
print(f"4 ranks read {2 * 16} rows, 3 ranks resumed from {path.name} and read the other 32:")
print("every row exactly once")
