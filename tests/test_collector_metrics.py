"""`GET /metrics`: a real scrape of the collector, parsed by `prometheus_client`'s own parser.

Issue #19 ("Prometheus"): per run and rank, rows (or tokens) per second, data-wait share,
step, state, last report age and checkpoints, so a cluster's Grafana can alert on a stalled
input pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from dashboard.collector.fleet import JUDGED, live_processes, live_totals
from dashboard.collector.metrics import METRICS_KEEP_S
from dashboard.collector.throughput import STRAGGLER_WINDOW_S
from dashboard.synthetic import SyntheticRun, synthetic_events
from tests.collector_api import collector_client, post, post_runs

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "m.db") as c:
        now = time.time()
        live = SyntheticRun("live", 4, 16, 10**6, 40, now - 40, slow_rank=3, checkpoint_every=10)
        dead = SyntheticRun("dead", 2, 4, 10**6, 20, now - 60)
        post_runs(c, live, dead)
        yield c


def _scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_scrape_has_every_run_and_rank(client: TestClient) -> None:
    samples = _scrape(client)
    state = "elastic_loader_run_state"
    assert _get(samples, state, run_id="live", state="running") == 1
    assert _get(samples, state, run_id="live", state="crashed") == 0
    assert _get(samples, state, run_id="dead", state="crashed") == 1
    assert _get(samples, "elastic_loader_run_world_size", run_id="live") == 4
    assert _get(samples, "elastic_loader_run_checkpoints_saved_total", run_id="live") == 4
    for rank in range(4):
        labels = {"run_id": "live", "rank": str(rank)}
        assert _get(samples, "elastic_loader_rank_rows_per_second", **labels) == pytest.approx(2000)
        wait = 0.6 if rank == 3 else 0.02  # the slow reader waits for data
        assert _get(samples, "elastic_loader_rank_data_wait_ratio", **labels) == pytest.approx(wait)
        assert _get(samples, "elastic_loader_rank_global_step", **labels) == 40 * 2000 // 32
        process = labels | {"process": str(rank)}  # no mesh: the global rank is the rank
        assert _get(samples, "elastic_loader_rank_last_report_age_seconds", **process) < 30
        assert _get(samples, "elastic_loader_rank_state", **process, state="running") == 1
    dead = {"run_id": "dead", "rank": "1", "process": "1"}
    assert _get(samples, "elastic_loader_rank_state", **dead, state="crashed") == 1
    assert _get(samples, "elastic_loader_rank_last_report_age_seconds", **dead) >= 39


def test_metrics_need_the_token_when_the_collector_has_one(tmp_path: Path) -> None:
    with collector_client(tmp_path / "t.db", token="s3cret") as c:
        assert c.get("/metrics").status_code == 401
        ok = c.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and "elastic_loader_run_state" in ok.text


def test_one_read_for_every_live_run_gives_each_run_its_own_rows(tmp_path: Path) -> None:
    """The scrape reads every live run's processes and throughput totals in one query each
    (dashboard.collector.fleet): per run, exactly the rows the per-run reads give (the
    current world only after a resize, tokens of a packed run), runs past the retention
    left out; and a report after a scrape shows in the next one."""
    now = time.time()
    resized = SyntheticRun("resized", 3, 12, 10**4, 30, now - 30, world_size_before=4)
    packed = [
        e | {"seq_len": 8, "tokens": 8 * e["rows"], "blocks_per_split": 10**6}
        if e["kind"] == "progress"
        else e
        for e in synthetic_events(SyntheticRun("packed", 2, 4, 10**6, 20, now - 20))
    ]
    old = SyntheticRun("old", 2, 4, 10**6, 20, now - METRICS_KEEP_S - 100, closed=True)
    with collector_client(tmp_path / "f.db") as c:
        post_runs(c, resized, old)
        assert post(c, packed).status_code == 202
        store = c.app.state.store  # type: ignore[attr-defined]
        since = now - METRICS_KEEP_S
        processes = live_processes(store, since)
        totals = live_totals(store, since, STRAGGLER_WINDOW_S)
        assert sorted(processes) == sorted(totals) == ["packed", "resized"]
        for run in (store.run("resized"), store.run("packed")):
            run_id, world = run["run_id"], run["world_size"]
            judged = [{k: p[k] for k in JUDGED} for p in store.heartbeats(run_id, world)]
            assert processes[run_id] == judged
            per_run = store.rank_totals(run_id, run["last_ts"] - STRAGGLER_WINDOW_S, world)
            assert totals[run_id] == {t["rank"]: tuple(t)[1:] for t in per_run}
        assert len(processes["resized"]) == 3 and totals["packed"][0][1] is not None
        before = _scrape(c)
        step = "elastic_loader_rank_global_step"
        assert _get(before, step, run_id="packed", rank="0") == 20 * 2000 // 32
        later = packed[-1] | {"ts": time.time(), "global_step": 10**6, "step": 10**6}
        assert post(c, [later]).status_code == 202
        assert _get(_scrape(c), step, run_id="packed", rank=str(later["rank"])) == 10**6
