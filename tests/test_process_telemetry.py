"""Telemetry of processes (issue 26 point 2): on a (dp=2, tp=2) mesh four processes read the
batches of two data-parallel ranks. The collector counts four processes, never folds one
into its peer, never doubles the rows, names a frozen peer by its global rank and mesh
coordinates, on the page's status and in /metrics, and shows "dp 0: ranks 0, 1 (tp)"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from dashboard.synthetic import SyntheticRun, synthetic_events
from loader.telemetry.reporter import process_of
from tests.collector_api import collector_client, post, view

DP, TP, SECONDS, RATE = 2, 2, 60, 2000.0
FROZEN, FROZEN_AT = 3, 30  # process 3 (dp 1, tp 1) stops 30 s before the others


def mesh_events(run_id: str, frozen: int | None) -> list[dict[str, Any]]:
    """Each event of a 2-rank run sent by both tensor-parallel peers of its rank."""
    start = float(int(time.time())) - SECONDS
    run = SyntheticRun(run_id, DP, 8, 100_000, SECONDS, start, rows_per_s=RATE)
    out = []
    for ev in synthetic_events(run):
        for tp in range(TP):
            process = ev["rank"] * TP + tp
            if process == frozen and ev["ts"] > start + SECONDS - FROZEN_AT:
                continue
            out.append(ev | {"global_rank": process, "mesh": {"dp": ev["rank"], "tp": tp}})
    return out


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "mesh.db") as c:
        yield c


def _metrics(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_peers_are_counted_as_processes_and_their_rows_once(client: TestClient) -> None:
    assert post(client, mesh_events("mesh", None)).status_code == 202
    status = view(client, "mesh", "status")
    assert status["state"] == "running"
    assert status["counts"]["running"] == DP * TP  # four processes, none folded into another
    assert status["headline"] == "Running: 4 of 4 processes reporting"
    progress = view(client, "mesh", "progress")
    assert progress["rows_per_s"] == pytest.approx(DP * RATE)  # not doubled by the peers
    assert [r["replicas"] for r in progress["ranks"]] == [
        "dp 0: ranks 0, 1 (tp)",
        "dp 1: ranks 2, 3 (tp)",
    ]
    placement = view(client, "mesh", "placement")
    assert [r["replicas"] for r in placement["current"]["ranks"]] == [
        "dp 0: ranks 0, 1 (tp)",
        "dp 1: ranks 2, 3 (tp)",
    ]
    slowest = view(client, "mesh", "throughput")["slowest"]
    assert sorted(r["rows_per_s"] for r in slowest) == pytest.approx([RATE, RATE])
    samples = _metrics(client)
    states = [k for k in samples if k[0] == "elastic_loader_rank_state"]
    assert len(states) == DP * TP
    assert samples[
        ("elastic_loader_rank_rows_per_second", (("rank", "1"), ("run_id", "mesh")))
    ] == pytest.approx(RATE)


def test_a_frozen_peer_is_named_by_its_global_rank_and_coordinates(client: TestClient) -> None:
    assert post(client, mesh_events("frozen", FROZEN)).status_code == 202
    status = view(client, "frozen", "status")
    assert status["state"] == "crashed", status["headline"]
    assert status["headline"].startswith(
        "Crashed: rank 3 (dp 1, tp 1) stopped reporting without closing, silent for"
    ), status["headline"]
    [dead] = [r for r in status["ranks"] if r["state"] == "crashed"]
    assert (dead["rank"], dead["process"], dead["mesh"]) == (1, 3, {"dp": 1, "tp": 1})
    assert status["counts"]["running"] == 3  # its peer, process 2, still runs
    placement = view(client, "frozen", "placement")
    assert [r["state"] for r in placement["current"]["ranks"]] == ["running", "crashed"]
    crashed = ("state", "crashed")
    key = (
        "elastic_loader_rank_state",
        (("process", "3"), ("rank", "1"), ("run_id", "frozen"), crashed),
    )
    assert _metrics(client)[key] == 1


class _OnAMesh:
    rank = 1
    mesh_coordinates: ClassVar[dict[str, int]] = {"dp": 1, "tp": 0}


def test_each_event_says_which_process_sent_it() -> None:
    """Without torch.distributed the global rank is the dataset's; the mesh's coordinates
    come from the dataset (`mesh_coordinates`, None without a mesh)."""
    assert process_of(_OnAMesh()) == {"global_rank": 1, "mesh": {"dp": 1, "tp": 0}}

    class Plain:
        rank = 2
        mesh_coordinates = None

    assert process_of(Plain()) == {"global_rank": 2}
