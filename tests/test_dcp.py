"""torch.distributed.checkpoint: save on 2 Gloo ranks, resume on 1 and on 4.

The loader is `Stateful`, and every rank's `state_dict()` is the same global state (per
split, not per rank), so DCP's de-duplication of replicated objects keeps one correct copy
whichever rank writes it. Rows are appended to the table after the save: the resumed runs
must still read the saved version. The source is a Lance dataset by path, so workers need
not import LanceDB (LanceDB tables are covered in test_resume_pinning.py). One spawned
group of 4 processes (ranks 0-1 save as a 2-rank Gloo group, then all 4 resume) keeps this
to one test of ~15 s of CPU, most of it importing torch in each process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import numpy as np
import orjson
import pyarrow as pa
import pytest
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.stateful import Stateful

from loader import StreamingDataLoader, StreamingDataset
from tests.batches import flat_ids
from tests.net import free_port

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

NUM_ROWS, NUM_SPLITS, BATCH, BATCHES_BEFORE = 960, 8, 10, 7


def _loader(
    uri: str, world: tuple[int, int] | None = None, version: int | None = None
) -> StreamingDataLoader:
    rank, world_size = world if world is not None else (None, None)
    ds = StreamingDataset(
        uri, columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=5, shuffle_clump_size=3,
        rank=rank, world_size=world_size, version=version,
    )  # fmt: skip
    return StreamingDataLoader(ds, batch_size=BATCH)


def _worker(rank: int, port: int, uri: str, out: str) -> None:
    """Ranks 0-1 save through a 2-rank Gloo group; then all 4 ranks resume from it."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    try:
        pair = dist.new_group([0, 1])  # every rank must take part in creating it
        if rank < 2:
            _save_half(rank, pair, uri, out)
        dist.barrier()
        if rank == 0:  # a writer lands after the checkpoint: the resume must not see it
            more = pa.table({"id": np.arange(NUM_ROWS, NUM_ROWS + 500, dtype=np.int64)})
            lance.write_dataset(more, uri, mode="append")
        dist.barrier()
        dl = _loader(uri)  # rank and world size 4 from torch.distributed
        dcp.load({"loader": dl}, checkpoint_id=f"{out}/dcp")
        skipped = dl.state_dict()["skipped"]  # before reading: the epoch's rows W=4 leaves out
        result = {
            "ids": flat_ids(dl),
            "skipped": skipped,
            "version": dl.streaming_dataset.source.spec.version,
        }
        Path(f"{out}/resume-{rank}.json").write_bytes(orjson.dumps(result))
    finally:
        dist.destroy_process_group()


def _save_half(rank: int, pair: Any, uri: str, out: str) -> None:
    # The pair is a sub-group of a 4-rank job, so the version is passed rather than broadcast
    # over the whole job (a 2-process job would broadcast it over its own default group).
    version = lance.dataset(uri).version
    dl = _loader(uri, world=(rank, 2), version=version)
    it = iter(dl)
    ids = flat_ids(next(it) for _ in range(BATCHES_BEFORE))
    states: list[Any] = [None, None]
    dist.all_gather_object(states, dl.state_dict(), group=pair)
    dcp.save({"loader": dl}, checkpoint_id=f"{out}/dcp", process_group=pair)
    result = {"ids": ids, "states": states, "stateful": isinstance(dl, Stateful)}
    Path(f"{out}/save-{rank}.json").write_bytes(orjson.dumps(result))


def _read(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # no_dist=True
def test_dcp_save_on_2_ranks_resume_on_1_and_4(tmp_path: Path) -> None:
    uri, out = str(tmp_path / "items.lance"), str(tmp_path)
    pinned = lance.write_dataset(pa.table({"id": np.arange(NUM_ROWS, dtype=np.int64)}), uri).version

    mp.spawn(_worker, args=(free_port(), uri, out), nprocs=4, join=True)
    saved = [_read(tmp_path / f"save-{r}.json") for r in range(2)]
    assert saved[0]["stateful"]
    assert saved[0]["states"][0] == saved[0]["states"][1]  # one global state on every rank
    state = saved[0]["states"][0]
    before = saved[0]["ids"] + saved[1]["ids"]
    assert len(before) == 2 * BATCHES_BEFORE * BATCH

    # World size 4: uneven cursors may leave a few rows for the next epoch, counted as skipped.
    resumed = [_read(tmp_path / f"resume-{r}.json") for r in range(4)]
    assert {r["version"] for r in resumed} == {pinned}
    rest4 = [i for r in resumed for i in r["ids"]]
    assert len(set(before + rest4)) == len(before) + len(rest4)  # nothing read twice
    assert max(rest4) < NUM_ROWS  # nothing appended after the save
    assert len(before) + len(rest4) + resumed[0]["skipped"] == NUM_ROWS

    # World size 1: no process group; DCP reads the checkpoint in this process.
    dl = _loader(uri, world=(0, 1))
    dcp.load({"loader": dl}, checkpoint_id=f"{out}/dcp", no_dist=True)
    assert dl.state_dict()["cursors"] == state["cursors"]
    assert dl.streaming_dataset.source.spec.version == pinned
    assert sorted(before + flat_ids(dl)) == list(range(NUM_ROWS))  # every saved-version row once
