"""The dashboard for a world size that does not divide S: W = 3 ranks over S = 8 splits with
G = 240, where ranks 0 and 1 share split 2 and ranks 1 and 2 share split 5 (issue 18).

Real loaders report to a real collector; its placement says who reads which part of a
shared split, its progress counts every row once, and the event check follows
`loader.layout` (any W <= G when G is a multiple of S; W | S for clients that send no G).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard import charts
from dashboard.launch import DashboardHandle, start_dashboard
from dashboard.placement import layout_of, owners
from dashboard.synthetic import SyntheticRun, synthetic_events
from loader import StreamingDataLoader, StreamingDataset
from loader.layout import owned_splits, rank_shares
from tests.collector_api import collector_client, post
from tests.net import get_json
from tests.tables import lancedb_table

W, S, G, L = 3, 8, 240, 300  # G/S = 30 rows of every split in a global step
STEPS = 3
# Ranks take positions [80r, 80(r+1)) of each step's 240 (split-major, 30 a split).
SHARED = [
    {
        "split": 2,
        "parts": [{"rank": 0, "start": 0, "stop": 20}, {"rank": 1, "start": 20, "stop": 30}],
    },
    {
        "split": 5,
        "parts": [{"rank": 1, "start": 0, "stop": 10}, {"rank": 2, "start": 10, "stop": 30}],
    },
]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "c.db") as c:
        yield c


def _get(handle: DashboardHandle, path: str) -> Any:
    return get_json(handle.api_url + path, 10)


def test_the_grid_follows_the_layout() -> None:
    grid = layout_of(W, S, G)
    assert grid["owner"] == [0, 0, 0, 1, 1, 1, 2, 2] == owners(W, S, G)
    assert grid["shared"] == SHARED and grid["rows_per_step"] == 30
    assert rank_shares(1, W, S, G) == [(10, 30), (30, 30), (30, 30), (10, 30)]
    assert layout_of(4, S, G)["shared"] == [] and owners(4, S) == [0, 0, 1, 1, 2, 2, 3, 3]
    more_ranks_than_splits = layout_of(16, S, 16)["shared"]  # one row of each split per rank
    assert [[p["rank"] for p in s["parts"]] for s in more_ranks_than_splits] == [
        [2 * s, 2 * s + 1] for s in range(S)
    ]
    with pytest.raises(ValueError, match="a global batch that is a multiple of num_splits"):
        owners(W, S)  # no G: W must divide S
    # A shared split is drawn as one cell per rank, as wide as its part.
    frame = charts.piece_frame(grid | {"world_size": W, "ranks": []})
    two = frame[frame["split"] == 2].sort_values("x")
    assert two["rank"].tolist() == [0, 1] and two["part"].tolist() == [
        "rows 0–19 of 30 a step",
        "rows 20–29 of 30 a step",
    ]
    assert two["x2"].tolist() == pytest.approx([2 + 20 / 30, 3])
    charts.placement_grid(grid | {"world_size": W, "ranks": []}, S, "now").to_dict()
    # W = 3 before any rank said G (e.g. only its resume event arrived): not known, not wrong
    unknown = layout_of(W, S) | {"world_size": W, "ranks": []}
    assert unknown["owner"] == [-1] * S and unknown["shared"] == []
    charts.placement_grid(unknown, S, "now").to_dict()


@pytest.mark.usefixtures("patient_telemetry")  # refusals, not load
def test_three_real_loaders_over_eight_splits_on_the_dashboard(tmp_path: Path) -> None:
    with start_dashboard(port=0, db=str(tmp_path / "c.db"), ui=False) as collector:
        _three_loaders_report(collector, tmp_path)


def _three_loaders_report(collector: DashboardHandle, tmp_path: Path) -> None:
    table = lancedb_table(tmp_path, rows=S * L)
    ids: list[int] = []
    loaders = []
    for rank in range(W):
        ds = StreamingDataset(table, columns=["id"], num_splits=S, rank=rank, world_size=W)
        dl = StreamingDataLoader(ds, global_batch_size=G, telemetry=collector.api_url, run_id="odd")
        it = iter(dl)
        ids += [i for _ in range(STEPS) for i in next(it)["id"].tolist()]
        loaders.append(dl)
    for dl in loaders:
        dl.close()  # the final report: each rank's position after its third step
        assert dl._telemetry.client.dropped == 0  # type: ignore[union-attr]
    assert len(ids) == len(set(ids)) == STEPS * G

    placement = _get(collector, "/api/runs/odd/placement")
    current = placement["current"]
    assert current["shared"] == SHARED and current["rows_per_step"] == 30
    assert current["global_batch_size"] == G and placement["any_world_size_up_to"] == G
    assert current["owner"] == [0, 0, 0, 1, 1, 1, 2, 2]
    ranks = current["ranks"]
    assert [r["splits"] for r in ranks] == [[0, 3], [2, 6], [5, 8]]
    assert all(r["cursors"] == [STEPS * G // S] * len(range(*r["splits"])) for r in ranks)

    progress = _get(collector, "/api/runs/odd/progress")
    assert progress["cursors"] == [STEPS * G // S] * S
    # Every row once: each rank counts its part of a shared split, not the whole split.
    assert [b["rows_done"] for b in progress["ranks"]] == [STEPS * G // W] * W
    assert progress["rows_done"] == STEPS * G
    assert progress["epoch_pct"] == pytest.approx(100 * STEPS * G / (S * L))


def test_a_synthetic_odd_world_is_drawn_with_its_shared_splits(client: TestClient) -> None:
    run = SyntheticRun("syn", W, S, 3000, 5, time.time() - 10, global_batch_size=G)
    response = post(client, synthetic_events(run))
    assert response.status_code == 202, response.text
    placement = client.get("/api/runs/syn/placement").json()
    assert placement["current"]["shared"] == SHARED
    progress = client.get("/api/runs/syn/progress").json()
    assert sum(b["rows_done"] for b in progress["ranks"]) == sum(progress["cursors"])


def _event(**fields: Any) -> dict[str, Any]:
    """A progress event of rank 1 (or `rank`) with the splits and cursors of its layout."""
    event = {"run_id": "e", "kind": "progress", "ts": time.time(), "rank": 1, "world_size": W}
    event |= {"num_splits": S, "global_batch_size": G, "rows_per_split": L} | fields
    if "splits" in fields:
        return event
    world, splits, batch = event["world_size"], event["num_splits"], event["global_batch_size"]
    owned = owned_splits(event["rank"], world, splits, batch)
    return {"splits": [owned.start, owned.stop], "cursors": [0] * len(owned)} | event


GOOD = {
    "rank 1 of 3 with both shared splits": _event(),
    "rank 0 of 3": _event(rank=0, splits=[0, 3], cursors=[0, 0, 0]),
    "W > S, G a multiple of S": _event(
        world_size=16, rank=5, global_batch_size=16, splits=[2, 3], cursors=[0]
    ),
    "an old client, W divides S": _event(
        world_size=4, global_batch_size=None, splits=[2, 4], cursors=[0, 0]
    ),
}
BAD = {
    "an old client, W does not divide S": (
        _event(global_batch_size=None, splits=None, cursors=None),
        "not divisible",
    ),
    "splits without the shared one": (
        _event(splits=[3, 5], cursors=[0, 0]),
        "are not rank 1's [2, 6]",
    ),
    "a cursor short": (_event(cursors=[0, 0, 0]), "cursors has 3 entries; rank 1 reads 4"),
    "G not a multiple of S nor of W": (
        _event(global_batch_size=250, splits=None, cursors=None),
        "not divisible",
    ),
    "W > G": (
        _event(world_size=300, global_batch_size=240, splits=None, cursors=None),
        "more than the global batch",
    ),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_any_world_size_that_fits_g_is_accepted(client: TestClient, name: str) -> None:
    response = post(client, [GOOD[name]])
    assert response.status_code == 202, response.text


@pytest.mark.parametrize("name", sorted(BAD))
def test_what_no_loader_sends_is_still_422(client: TestClient, name: str) -> None:
    event, why = BAD[name]
    response = post(client, [event])
    assert response.status_code == 422 and why in response.text, response.text


def test_packed_ranks_count_their_part_of_a_shared_split(tmp_path: Path) -> None:
    """Packed blocks on W = 3 over S = 4 with G = 12 (3 blocks of every split a step): each
    rank's `tokens` is its 4 blocks a step, not the cursors of every split it touches."""
    seq_len, splits, steps = 8, 4, 2
    docs = [[d * 100 + k + 1 for k in range(3 + d % 11)] for d in range(120)]
    db = lancedb.connect(str(tmp_path / "lance"))
    table = db.create_table("docs", pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}))
    with start_dashboard(port=0, db=str(tmp_path / "d.db"), ui=False) as collector:
        loaders = []
        for rank in range(W):
            ds = StreamingDataset(
                table, columns=["tokens"], num_splits=splits, rank=rank, world_size=W,
                pack_sequences=seq_len, eos_id=0,
            )  # fmt: skip
            dl = StreamingDataLoader(
                ds, global_batch_size=12, telemetry=collector.api_url, run_id="lm"
            )
            it = iter(dl)
            for _ in range(steps):
                next(it)
            loaders.append(dl)
        for dl in loaders:
            dl.close()
        progress = _get(collector, "/api/runs/lm/progress")
    assert [r["tokens"] for r in progress["ranks"]] == [steps * 4 * seq_len] * W
    assert progress["tokens_done"] == steps * 12 * seq_len
    assert progress["rows_done"] == steps * 12  # blocks, each counted once


def test_the_job_eta_counts_g_rows_a_step_when_batches_differ(client: TestClient) -> None:
    """W = 3 with G = 256: per-rank batches 85, 85, 86; a step is 256 rows, not 3 × 85."""
    now = time.time()
    events = []
    for rank, batch in enumerate([85, 85, 86]):
        ev = _event(rank=rank, global_batch_size=256, batch_size=batch, total_steps=100)
        ev |= {"ts": now - 1 + rank / 10, "run_id": "eta", "global_step": 10, "step": 10}
        events.append(ev | {"rows_per_s": 100.0, "interval_s": 1.0, "rows": 100, "batches": 1})
    assert post(client, events).status_code == 202
    job = client.get("/api/runs/eta/progress").json()["job"]
    assert job["label"] == "step 10 of 100"
    assert job["eta_s"] == pytest.approx(90 * 256 / 300)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 12).flatmap(  # S, G = k * S, W <= min(G, 48), whole steps read t of m
        lambda s: st.tuples(
            st.just(s), st.integers(1, 6).map(lambda k: k * s), st.integers(1, 5)
        ).flatmap(
            lambda sgm: st.tuples(
                st.just(sgm), st.integers(1, min(sgm[1], 48)), st.integers(0, sgm[2])
            )
        )
    )
)
def test_any_world_up_to_g_is_drawn_and_counted_once(
    tmp_path_factory: pytest.TempPathFactory, layout: tuple[tuple[int, int, int], int, int]
) -> None:
    """Every rank of any W <= G reports the same level cursors (t whole steps): accepted;
    each split's parts tile its G/S rows in rank order; the bars add up to the cursors."""
    (splits, batch, steps_per_epoch), world, steps = layout
    per = batch // splits
    length, level = per * steps_per_epoch, per * steps
    events = []
    for rank in range(world):
        owned = owned_splits(rank, world, splits, batch)
        ev = _event(rank=rank, world_size=world, num_splits=splits, global_batch_size=batch)
        events.append(
            ev | {"run_id": "p", "rows_per_split": length, "cursors": [level] * len(owned)}
        )
    with collector_client(tmp_path_factory.mktemp("any") / "p.db") as client:
        assert post(client, events).status_code == 202
        current = client.get("/api/runs/p/placement").json()["current"]
        progress = client.get("/api/runs/p/progress").json()
    readers = {s: [(0, per, o)] for s, o in enumerate(current["owner"])}  # whole splits
    for shared in current["shared"]:
        readers[shared["split"]] = [(p["start"], p["stop"], p["rank"]) for p in shared["parts"]]
    for parts in readers.values():
        assert [a for a, _, _ in parts] == [0] + [b for _, b, _ in parts[:-1]]  # contiguous
        assert parts[-1][1] == per and [r for *_, r in parts] == sorted(r for *_, r in parts)
    assert progress["rows_done"] == splits * level == sum(progress["cursors"])
    assert sum(b["rows_total"] for b in progress["ranks"]) == splits * length
