"""/metrics at scale and safe (issue 25 point 5): label values escaped as the exposition
format requires, finished runs aging out, and the repository's Prometheus alert rules and
Grafana dashboard (dashboard/monitoring/) evaluated against a real scrape (tests/promql.py:
the subset of PromQL they use, since promtool is not installed everywhere)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from dashboard.collector.metrics import METRICS_KEEP_S
from dashboard.synthetic import SyntheticRun, synthetic_events
from loader import wire
from tests.collector_api import collector_client, post, post_runs
from tests.promql import evaluate, exprs_of, samples

MONITORING = Path(__file__).parent.parent / "dashboard" / "monitoring"
ODD = ["web,en", 'quo"te', "back\\slash", "new\nline", "ünï ✓ 数据"]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "m.db") as c:
        yield c


def _scraped(client: TestClient) -> list[tuple[str, dict[str, str], float]]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return samples(response.text)


def _runs(series: list[tuple[dict[str, str], float]]) -> set[str]:
    return {labels["run_id"] for labels, _ in series}


def _jobs(client: TestClient) -> None:
    """A healthy job with an input-bound rank, a crashed one, one that finished long ago."""
    now = time.time()
    live = SyntheticRun("live", 4, 16, 10**6, 40, now - 40, slow_rank=3, checkpoint_every=10)
    dead = SyntheticRun("dead", 2, 4, 10**6, 20, now - 60)
    old = SyntheticRun("old", 2, 4, 10**6, 20, now - METRICS_KEEP_S - 100, closed=True)
    post_runs(client, live, dead, old)


def test_the_alert_rules_fire_on_the_runs_they_name(client: TestClient) -> None:
    _jobs(client)
    scraped = _scraped(client)
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    fired = {
        rule["alert"]: _runs(evaluate(rule["expr"], scraped))
        for group in rules["groups"]
        for rule in group["rules"]
    }
    assert fired == {
        "ElasticLoaderRunCrashed": {"dead"},
        "ElasticLoaderRunStalled": set(),
        "ElasticLoaderProcessCrashed": {"dead"},
        "ElasticLoaderInputBound": {"live"},  # rank 3 waits 60 % of the time
    }
    crashed = evaluate('elastic_loader_rank_state{state="crashed"} == 1', scraped)
    assert sorted(labels["process"] for labels, _ in crashed) == ["0", "1"]


def test_every_grafana_panel_reads_series_the_collector_exposes(client: TestClient) -> None:
    _jobs(client)
    scraped = _scraped(client)
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert board["uid"] == "elastic-loader" and board["panels"]
    empty = []
    for expr in exprs_of(board):
        result = evaluate(expr.replace("$run", ".*"), scraped)
        if not result:
            empty.append(expr)
    # packed and mixture runs are absent here: their two panels are the only empty ones
    assert [e.split("(")[2].split("{")[0] for e in empty] == [
        "elastic_loader_rank_tokens_per_second",
        "elastic_loader_mixture_weight",
    ]


def test_finished_runs_age_out_of_the_scrape(client: TestClient) -> None:
    _jobs(client)
    runs = {labels["run_id"] for _, labels, _ in _scraped(client) if "run_id" in labels}
    assert runs == {"live", "dead"}  # "old" ended more than 15 minutes ago
    assert client.get("/api/runs/old/status").json()["state"] == "stopped"  # still in the API


def _mixture_event(run_id: str, names: list[str]) -> dict[str, Any]:
    run = SyntheticRun(run_id, 1, 4, 1000, 2, time.time() - 2)
    base = next(iter(synthetic_events(run)))
    data = {"names": names, "weights": ["1/5"] * len(names), "phase_start": 0}
    data |= {"supplied": [7] * len(names), "passes": [1] * len(names)}
    return base | {"kind": wire.MIXTURE, "data": data, "global_step": 3}


def test_label_values_are_escaped_as_the_format_requires(client: TestClient) -> None:
    """A dataset named `web,en` stays one dataset; quotes, backslashes, line feeds and any
    Unicode come back from the parser exactly as sent (and the run id's too)."""
    run_id = 'odd "run" \\ ✓'
    run = SyntheticRun(run_id, 1, 4, 1000, 3, time.time() - 3)
    assert post(client, [*synthetic_events(run), _mixture_event(run_id, ODD)]).status_code == 202
    scraped = _scraped(client)
    weights = [
        (labels["run_id"], labels["dataset"], value)
        for name, labels, value in scraped
        if name == "elastic_loader_mixture_weight"
    ]
    assert weights == [(run_id, name, 0.2) for name in ODD]
    text = client.get("/metrics").text
    assert 'dataset="web,en"' in text and 'dataset="new\\nline"' in text
    assert 'dataset="quo\\"te"' in text and 'dataset="back\\\\slash"' in text
