"""The loader's promises through real LanceDB, Arrow and Parquet tables (in one process).

Ranks run one after another in this process, each with its own dataset and loader, which
is exactly what separate processes would compute: nothing is shared between ranks.
"""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from tests.strategies import resize_jobs


def open_ranks(
    source: Any, rows: int, world: int, batch: int | None, **kw: Any
) -> list[StreamingDataLoader]:
    """W ranks' loaders: `batch` rows each, or (batch None) the `global_batch` in `dl`."""
    filter_ = (
        (pc.field("id") < rows)
        if not isinstance(source, type(None)) and _is_arrow(source)
        else f"id < {rows}"
    )
    loaders = []
    for rank in range(world):
        ds = StreamingDataset(
            source, filter=filter_, rank=rank, world_size=world, **kw.get("ds", {})
        )
        sizes = {} if batch is None else {"batch_size": batch}
        loaders.append(StreamingDataLoader(ds, **sizes, **kw.get("dl", {})))
    return loaders


def _is_arrow(source: Any) -> bool:
    return not hasattr(source, "to_lance")


def ids_of(batch: dict[str, Any]) -> list[int]:
    ids = batch["id"].tolist()
    # every column is derived from id: a misaligned column would show here
    assert batch["label"].tolist() == [i % 6 for i in ids]
    assert [round(float(v)) for v in batch["x"][:, 0]] == ids
    assert batch["name"] == [f"row-{i}" for i in ids]
    return ids


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    job = draw(
        resize_jobs(
            [1, 2, 4, 6, 7, 8, 12],
            max_batch=64,
            max_seed=1000,
            max_clump=50,
            max_epoch=2,
            max_world=16,
        )
    )
    keys = ("num_splits", "shuffle", "shuffle_seed", "shuffle_clump_size", "epoch")
    job["ds"] = {key: job.pop(key) for key in keys}
    job["kind"] = draw(st.sampled_from(["lancedb", "arrow", "parquet"]))
    return job


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(job=jobs())
def test_crash_and_resume_through_real_tables(
    job: dict[str, Any], lance_rows: Any, arrow_rows: Any, parquet_rows: Any
) -> None:
    source = {"lancedb": lance_rows, "arrow": arrow_rows, "parquet": str(parquet_rows)}[job["kind"]]
    dl_kw = {"drop_last": job["drop_last"], "global_batch_size": job["global_batch"]}
    before = open_ranks(source, job["rows"], job["world"], job["batch"], ds=job["ds"], dl=dl_kw)
    lengths = {len(dl) for dl in before}
    assert len(lengths) == 1
    total = lengths.pop()
    cut = int(job["cut"] * total)
    read: list[int] = []
    states = []
    for dl in before:
        read += [i for batch in itertools.islice(dl, cut) for i in ids_of(batch)]
        states.append(dl.state_dict())
    assert all(s == states[0] for s in states), "every rank writes the same state"
    epoch = job["ds"]["epoch"]
    if cut == total > 0:  # saved after the last batch: resumes at the start of the next epoch
        assert states[0]["epoch"] == epoch + 1 and set(states[0]["cursors"]) == {0}
        return
    dl_kw["global_batch_size"] = job["new_global_batch"]
    after = open_ranks(
        source, job["rows"], job["new_world"], job["new_batch"], ds=job["ds"], dl=dl_kw
    )
    for dl in after:
        dl.load_state_dict(states[0])
    skipped = after[0].state_dict()["skipped"]
    assert len({len(dl) for dl in after}) == 1, "every rank yields the same number of batches"
    for dl in after:
        got = [ids_of(b) for b in dl]
        read += [i for batch in got for i in batch]
    assert len(read) == len(set(read)), "no row twice"
    assert set(read) <= set(range(job["rows"]))
    splits = job["ds"]["num_splits"]
    assert len(read) == splits * (job["rows"] // splits) - skipped, "every row once but the skipped"
    same = (job["new_world"], job["new_batch"], job["new_global_batch"]) == (
        job["world"],
        job["batch"],
        job["global_batch"],
    )
    if not job["drop_last"] and same and after[0].global_batch_size % splits == 0:
        # the step layout skips only a last step with fewer rows than ranks
        tail = splits * (job["rows"] // splits) % after[0].global_batch_size
        assert skipped == (tail if tail < job["world"] else 0)
    elif not job["drop_last"] and same:
        assert skipped == 0
    finished = after[0].state_dict()
    assert finished["epoch"] == epoch + 1 and set(finished["cursors"]) == {0}


def run_epoch(source: Any, world: int, global_batch: int, **kw: Any) -> list[list[int]]:
    """Global batches of one epoch: the sorted union over ranks of batch t."""
    loaders = open_ranks(
        source,
        600,
        world,
        None,
        ds={"num_splits": 12, "shuffle_clump_size": 7},
        dl={"global_batch_size": global_batch},
    )
    per_rank = [[ids_of(b) for b in dl] for dl in loaders]
    return [sorted(i for rank in per_rank for i in rank[t]) for t in range(len(per_rank[0]))]


def test_global_batches_identical_for_every_world_size(lance_rows: Any) -> None:
    reference = run_epoch(lance_rows, 1, 48)
    assert sorted(i for b in reference for i in b) == list(range(600))
    for world in (2, 3, 4, 5, 6, 7, 12, 13, 24):  # divisors of S = 12 or not, W > S too
        assert run_epoch(lance_rows, world, 48) == reference
    # the last step holds 24 rows (2 of each split): on 48 ranks one would get none, so it
    # is dropped for the epoch and counted
    assert run_epoch(lance_rows, 48, 48) == reference[:-1]


def test_global_batches_identical_with_a_filter_and_arrow(
    arrow_rows: Any, parquet_rows: Any
) -> None:
    assert run_epoch(arrow_rows, 4, 24) == run_epoch(str(parquet_rows), 6, 24)
