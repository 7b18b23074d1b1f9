"""The processes of tests/test_mesh.py: one Gloo job of 6 processes that plays, in turn,
a (dp=2, tp=2) job saved mid-epoch with DCP, its resumes on (3, 2) and (1, 2), the ways a
dataset without a mesh is refused, pipeline stages that read, a mixture on a mesh, and a
process that never builds the dataset. Each process writes what it saw to `rank{r}.json`.
Then (issue 33) processes that build other datasets, or place them otherwise, are refused
on every process, and set_weights waits only for the processes that build the mixture.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lance
import numpy as np
import orjson
import pyarrow as pa
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from loader import MixedDataset, StreamingDataLoader, StreamingDataset
from loader.trainers.torchtitan import TitanDataLoader
from loader.world import ENV_AGREE_TIMEOUT

NUM_ROWS, NUM_SPLITS, GLOBAL_BATCH, SAVED_AT = 720, 12, 24, 10  # 30 steps an epoch
APPENDED = 240  # rows a process appends while the (2, 2) job starts
# torchtitan: 61 rows a split, 2 a step: 30 full steps an epoch and a short one dropped.
TITAN_ROWS, TITAN_SAVED_AT, TITAN_STEPS = 735, 35, 45


def table(path: Path, start: int, stop: int) -> None:
    lance.write_dataset(pa.table({"id": np.arange(start, stop, dtype=np.int64)}), str(path))


def run(rank: int, port: int, job: dict[str, Any]) -> None:
    os.environ[ENV_AGREE_TIMEOUT] = str(job["agree_s"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=6)
    try:
        record = _phases(rank, job)
        Path(job["out"], f"rank{rank}.json").write_bytes(orjson.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _phases(rank: int, job: dict[str, Any]) -> dict[str, Any]:
    # Every process takes part in making every group and mesh (new_group is collective).
    first4, first2 = dist.new_group([0, 1, 2, 3]), dist.new_group([0, 1])
    names = ("dp", "tp")
    mesh22 = DeviceMesh("cpu", torch.arange(4).view(2, 2), mesh_dim_names=names)
    mesh12 = DeviceMesh("cpu", torch.arange(2).view(1, 2), mesh_dim_names=names)
    mesh32 = init_device_mesh("cpu", (3, 2), mesh_dim_names=names)
    stages = DeviceMesh("cpu", torch.arange(6).view(3, 2), mesh_dim_names=("pp", "dp"))
    mesh23 = DeviceMesh("cpu", torch.arange(6).view(2, 3), mesh_dim_names=names)
    record: dict[str, Any] = {}
    if rank < 4:
        record["A"] = _save_on_2x2(rank, job, mesh22, first4)
    dist.barrier()
    record["B"] = _resume(job, mesh32, None)
    dist.barrier()
    if rank < 2:
        record["C"] = _resume(job, mesh12, first2)
    record["refused"] = _refused(job, mesh32)
    record["pp"] = _pipeline(job, stages)
    record["mixture"] = _mixture(job, mesh32)
    record["differ"] = _differ(rank, job, mesh32, mesh23)
    record["pp_mix"] = _pipeline_mixture(job, stages)
    if rank == 0:  # an eval mixture rank 0 builds alone: set_weights waits for nobody
        evals = _mixture_loader(job, None, rank=0, world_size=1)
        evals.set_weights([1, 1], at_step=1)
        record["eval_mix"] = len(next(iter(evals))["id"])
    if rank < 4:
        record["titan_saved"] = _titan(job, mesh22, first4, load=False)
    dist.barrier()
    record["titan_resumed"] = _titan(job, mesh32, None, load=True)
    dist.barrier()  # last: the process that stays away leaves its message unanswered
    record["missing"] = _missing(rank, job, mesh32)
    return record


def _loader(source: Any, mesh: Any, **kw: Any) -> StreamingDataLoader:
    ds = StreamingDataset(
        source, columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=None, shuffle_clump_size=3,
        mesh=mesh, **kw,
    )  # fmt: skip
    return StreamingDataLoader(ds, global_batch_size=GLOBAL_BATCH)


def _seen(dl: StreamingDataLoader, steps: int | None) -> dict[str, Any]:
    ds = dl.streaming_dataset
    batches = []
    for batch in dl:
        batches.append(batch["id"].tolist())
        if len(batches) == steps:
            break
    return {
        "batches": batches,
        "dp": ds.rank,
        "dp_size": ds.world_size,
        "coords": ds.mesh_coordinates,
        "version": ds.source.spec.version,
        "rows": ds.num_rows,
        "seed": ds.shuffle_seed,
    }


def _save_on_2x2(rank: int, job: dict[str, Any], mesh: Any, group: Any) -> dict[str, Any]:
    """A write lands while the processes start: process 0 has opened the table before it,
    the others after. All must read the version process 0 saw."""
    uri = job["uri"]
    handle = lance.dataset(uri) if rank == 0 else None
    dist.barrier(group)
    if rank == 3:
        lance.write_dataset(
            pa.table({"id": np.arange(NUM_ROWS, NUM_ROWS + APPENDED, dtype=np.int64)}),
            uri,
            mode="append",
        )
    dist.barrier(group)
    dl = _loader(handle if rank == 0 else uri, mesh)
    seen = _seen(dl, SAVED_AT)
    states: list[Any] = [None] * 4
    dist.all_gather_object(states, dl.state_dict(), group=group)
    seen["states_equal"] = all(s == states[0] for s in states)
    dcp.save({"dataloader": dl}, checkpoint_id=job["dcp"], process_group=group)
    return seen


def _resume(job: dict[str, Any], mesh: Any, group: Any) -> dict[str, Any]:
    dl = _loader(job["uri"], mesh)  # the table has grown: the state re-pins the saved version
    dcp.load({"dataloader": dl}, checkpoint_id=job["dcp"], process_group=group)
    return _seen(dl, None)


def _refused(job: dict[str, Any], mesh: Any) -> dict[str, str]:
    """Without a mesh, a dataset whose place is not the process's must say how it agrees."""
    dp = mesh.get_local_rank("dp")
    tries = {
        "no_group": {"rank": dp, "world_size": 3},
        "dp_group": {"rank": dp, "world_size": 3, "process_group": mesh.get_group("dp")},
        "dp_group_seed": {
            "rank": dp,
            "world_size": 3,
            "process_group": mesh.get_group("dp"),
            "shuffle_seed": None,
        },
        "rank_not_mesh": {"mesh": mesh, "rank": (dp + 1) % 3},
        "dp_slice": {"mesh": mesh["dp"]},
    }
    refused = {}
    for name, kw in tries.items():
        try:
            StreamingDataset(job["uri"], columns=["id"], num_splits=NUM_SPLITS, **kw)
        except ValueError as err:
            refused[name] = str(err)
    return refused


def _pipeline(job: dict[str, Any], stages: Any) -> dict[str, Any]:
    """Stages 0 and 2 of 3 read (inputs, labels); stage 1 never builds the dataset."""
    read_on = {"pp": [0, 2]}
    if stages.get_local_rank("pp") == 1:
        try:
            _loader(job["uri"], stages, read_on=read_on)
        except ValueError as err:
            return {"error": str(err)}
        return {"error": None}
    return _seen(_loader(job["uri"], stages, read_on=read_on), 4)


def _mixture(job: dict[str, Any], mesh: Any) -> dict[str, Any]:
    parts = {
        name: StreamingDataset(
            job[name], columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=3, mesh=mesh
        )
        for name in ("web", "code")
    }
    mix = MixedDataset(parts, [2, 1])
    dl = StreamingDataLoader(mix, global_batch_size=GLOBAL_BATCH)
    batches = []
    for batch in dl:
        batches.append(batch["id"].tolist())
        if len(batches) == 4:
            break
    return {"batches": batches, "dp": mix.rank, "coords": mix.mesh_coordinates}


def _refusal(build: Any) -> str:
    try:
        build()
    except ValueError as err:
        return str(err)
    return "built"


def _differ(rank: int, job: dict[str, Any], mesh: Any, mesh23: Any) -> dict[str, str]:
    """Issue 33 items 1-3: another dataset (built in another order), other dp_dims, another
    mesh shape, another batch size or weights on one process: refused on every process."""
    seen: dict[str, str] = {}
    uris = [job["uri"], job["web"]] if rank == 0 else [job["web"], job["uri"]]
    for i, uri in enumerate(uris):  # process 0 builds them in the other order
        seen[f"order{i}"] = _refusal(lambda uri=uri: _loader(uri, mesh))
        seen[f"order_group{i}"] = _refusal(  # without a mesh: the default group agrees
            lambda uri=uri: StreamingDataset(uri, columns=["id"], num_splits=12, shuffle_seed=None)
        )
    dp_dims = ("dp", "tp") if rank == 3 else ("dp",)
    seen["dp_dims"] = _refusal(lambda: _loader(job["uri"], mesh, dp_dims=dp_dims))
    seen["shape"] = _refusal(lambda: _loader(job["uri"], mesh23 if rank == 5 else mesh))
    ds = StreamingDataset(job["uri"], columns=["id"], num_splits=NUM_SPLITS, mesh=mesh)
    g = 2 * GLOBAL_BATCH if rank == 2 else GLOBAL_BATCH
    seen["batch"] = _refusal(lambda: StreamingDataLoader(ds, global_batch_size=g))
    weights = [1, 1] if rank == 4 else [2, 1]
    seen["weights"] = _refusal(lambda: _mixture_loader(job, mesh, weights=weights))
    return seen


def _mixture_loader(
    job: dict[str, Any], mesh: Any, weights: Any = (2, 1), **kw: Any
) -> StreamingDataLoader:
    parts = {
        name: StreamingDataset(
            job[name], columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=3, mesh=mesh, **kw
        )
        for name in ("web", "code")
    }
    return StreamingDataLoader(MixedDataset(parts, list(weights)), global_batch_size=GLOBAL_BATCH)


def _pipeline_mixture(job: dict[str, Any], stages: Any) -> dict[str, Any] | None:
    """Issue 33 item 4: set_weights on the stages that read (stage 1 builds nothing)."""
    if stages.get_local_rank("pp") == 1:
        return None
    dl = _mixture_loader(job, stages, read_on={"pp": [0, 2]})
    dl.set_weights([1, 1], at_step=2)
    batches = []
    for batch in dl:
        batches.append(batch["id"].tolist())
        if len(batches) == 4:
            break
    return {"batches": batches, "dp": dl.streaming_dataset.rank}


def titan_dataset(uri: str, mesh: Any = None) -> StreamingDataset:
    return StreamingDataset(
        uri, columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=11, shuffle_clump_size=4,
        mesh=mesh, rank=None if mesh is not None else 0, world_size=None if mesh else 1,
    )  # fmt: skip


def titan_step(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    return {"input": batch["id"]}, batch["id"]


def _titan(job: dict[str, Any], mesh: Any, group: Any, load: bool) -> dict[str, Any]:
    """As torchtitan's trainer: the checkpointer loads "dataloader" by DCP before the one
    iterator is made; `next` for every step; a DCP save mid-run (here in the second epoch)."""
    dl = TitanDataLoader(titan_dataset(job["titan"], mesh), GLOBAL_BATCH, to_inputs=titan_step)
    states = {"dataloader": dl}
    if load:
        dcp.load(states, checkpoint_id=job["titan_dcp"])
    data_iterator = iter(dl)
    first = TITAN_SAVED_AT if load else 0
    batches = []
    for step in range(first, TITAN_STEPS if load else TITAN_SAVED_AT):
        inputs, _labels = next(data_iterator)
        batches.append(inputs["input"].tolist())
        if step + 1 == TITAN_SAVED_AT and not load:
            dcp.save(states, checkpoint_id=job["titan_dcp"], process_group=group)
    return {"batches": batches, "dp": dl.loader.streaming_dataset.rank}


def _missing(rank: int, job: dict[str, Any], mesh: Any) -> str | None:
    """Process 5 does not build the dataset: the others say so, naming it."""
    if rank == 5:
        return None
    try:
        StreamingDataset(job["uri"], columns=["id"], num_splits=NUM_SPLITS, mesh=mesh)
    except TimeoutError as err:
        return str(err)
    return "built"
