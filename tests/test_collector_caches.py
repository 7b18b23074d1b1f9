"""The node cache panel's data (`GET /api/runs/{id}/caches`) and its /metrics lines: per
host and cache folder, from the latest `cache` report, with the prefetcher's keys."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from dashboard.collector import answers, caches
from dashboard.synthetic import SyntheticRun, cache_event, synthetic_events, with_caches
from tests.collector_api import collector_client, post, post_runs, view

MB = 1 << 20
HEALTHY = {"cache_dir": "/nvme/cache", "hits": 950, "misses": 50, "bytes_from_store": 50 * MB,
           "bytes_from_cache": 950 * MB, "evictions": 3, "refetched": 0, "prefetched": 48,
           "prefetch_lead": 6}  # fmt: skip
DAMAGED = {"cache_dir": "/nvme/cache", "hits": 300, "misses": 200, "bytes_from_store": 400 * MB,
           "bytes_from_cache": 600 * MB, "evictions": 120, "refetched": 2, "prefetched": 0,
           "prefetch_lead": None}  # fmt: skip


def cached_run(now: float) -> tuple[SyntheticRun, list[dict[str, Any]]]:
    """A run on two hosts (16 ranks: node0, node1) and their cache reports: node0 healthy,
    node1 with refetches and 40 % of its bytes from the store (an earlier report first)."""
    run = SyntheticRun("cached", 16, 16, 10**5, 20, now - 20)
    older = {**DAMAGED, "hits": 10, "refetched": 0}
    reports = [cache_event(run, 8, now - 10, **older)]
    reports += [cache_event(run, 0, now - 1, **HEALTHY), cache_event(run, 9, now - 1, **DAMAGED)]
    return run, reports


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "c.db") as c:
        now = time.time()
        run, reports = cached_run(now)
        post_runs(c, run, SyntheticRun("plain", 2, 4, 10**5, 20, now - 20))
        assert post(c, reports).status_code == 202
        yield c


def test_the_panel_data_is_each_node_caches_latest_report(client: TestClient) -> None:
    got = view(client, "cached", "caches")
    answers.CachesPublic.model_validate(got)  # the published model
    assert [(n["host"], n["cache_dir"]) for n in got["nodes"]] == [
        ("node0", "/nvme/cache"),
        ("node1", "/nvme/cache"),
    ]
    healthy, damaged = got["nodes"]
    assert healthy["hit_rate"] == pytest.approx(0.95)
    assert healthy["store_share"] == pytest.approx(0.05)
    assert (healthy["prefetched"], healthy["prefetch_lead"], healthy["warnings"]) == (48, 6.0, [])
    assert damaged["hits"] == 300 and damaged["hit_rate"] == pytest.approx(0.6)
    assert damaged["store_share"] == pytest.approx(0.4) and damaged["prefetch_lead"] is None
    assert damaged["warnings"] == [
        "node1 (/nvme/cache) fetched 40 % of its bytes from the store (expected of a cold "
        "cache in its first epoch; after it, the cache may be too small for the data: see "
        "cache_limit)",
        "node1 (/nvme/cache): 2 cached files were damaged or missing and fetched again",
    ]
    assert not healthy["stale"] and healthy["age_s"] < caches.STALE_S
    assert view(client, "plain", "caches")["nodes"] == []  # no cache: nothing to claim


def test_a_report_older_than_stale_s_is_marked_with_its_receipt(client: TestClient) -> None:
    store = client.app.state.store  # type: ignore[attr-defined]
    run = store.run("cached")
    fresh = caches.caches(store, run, time.time())["nodes"][0]
    later = caches.caches(store, run, fresh["received_ts"] + caches.STALE_S + 1)["nodes"][0]
    assert later["stale"] and later["received_ts"] == fresh["received_ts"]


def test_metrics_export_the_prefetchers_keys(client: TestClient) -> None:
    text = client.get("/metrics").text
    samples = {
        (s.name, s.labels.get("run_id"), s.labels.get("host")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    prefetched = "elastic_loader_node_cache_prefetched_total"
    lead = "elastic_loader_node_cache_prefetch_lead_steps"
    assert samples[(prefetched, "cached", "node0")] == 48
    assert samples[(prefetched, "cached", "node1")] == 0
    assert samples[(lead, "cached", "node0")] == 6
    assert (lead, "cached", "node1") not in samples  # null: omitted, not 0
    assert f"# TYPE {lead} gauge" in text and f"# TYPE {prefetched} counter" in text
    assert samples[("elastic_loader_node_cache_refetched_total", "cached", "node1")] == 2


def test_the_demo_runs_caches_are_warm_on_every_host(tmp_path: Path) -> None:
    with collector_client(tmp_path / "d.db") as c:
        run = SyntheticRun("demo", 16, 16, 10**5, 12, time.time() - 12)
        assert post(c, with_caches(run, synthetic_events(run))).status_code == 202
        nodes = view(c, "demo", "caches")["nodes"]
    assert [n["host"] for n in nodes] == ["node0", "node1"]
    assert all(n["hit_rate"] == pytest.approx(0.96) and not n["warnings"] for n in nodes)
    assert {n["prefetch_lead"] for n in nodes} == {4.0}


counts = st.one_of(st.none(), st.integers(0, 2**53), st.text(max_size=3), st.booleans())


@given(
    data=st.fixed_dictionaries({k: counts for k in caches.COUNTERS}),
    lead=st.one_of(st.none(), st.integers(0, 10**6), st.floats(0, 1e6), st.text(max_size=3)),
)
def test_the_panel_never_claims_what_the_report_does_not_say(
    data: dict[str, Any], lead: Any
) -> None:
    """Whatever a sender put in a report (values of any type): shares within [0, 1] or
    None, a store warning iff a quarter or more of the bytes came from the store, a refetch
    warning iff files were refetched, no counter that was not a whole number."""
    row = caches.node(
        {**data, "prefetch_lead": lead, "host": "h", "cache_dir": "d", "recv": 0.0}, 1.0
    )
    ints = {k: v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)}
    assert {k: row[k] for k in caches.COUNTERS if row[k] is not None} == ints
    for share in (row["hit_rate"], row["store_share"]):
        assert share is None or 0 <= share <= 1
    warned = " ".join(row["warnings"])
    store_heavy = row["store_share"] is not None and row["store_share"] >= caches.STORE_SHARE_WARN
    assert ("from the store" in warned) == store_heavy
    assert ("fetched again" in warned) == bool(ints.get("refetched"))
    assert (row["prefetch_lead"] is None) == (not isinstance(lead, int | float))
