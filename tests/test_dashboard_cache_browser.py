"""Headless Chromium reads the node cache panel on the Throughput page: a run cached on two
hosts (node0 healthy, node1 with refetched files and 40 % of its bytes from the store) and a
run without a cache. Real collector and Streamlit servers on 127.0.0.1; the events come
from dashboard/synthetic.py, received now (liveness is by receipt)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from dashboard.launch import start_dashboard
from dashboard.synthetic import SyntheticRun, post_events, synthetic_events
from tests.test_collector_caches import cached_run
from tests.test_dashboard_browser import _shot, chromium_page, page_url

pytestmark = pytest.mark.slow  # starts servers and a browser

LOAD_S = 30_000  # ms: the first render of a page on a loaded machine


@pytest.fixture(scope="module")
def ui_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("cache") / "c.db"
    with start_dashboard(port=0, ui_port=0, db=str(db)) as servers:
        now = time.time()
        run, reports = cached_run(now)
        plain = SyntheticRun("plain", 2, 4, 10**5, 20, now - 20)
        events = [*synthetic_events(run), *synthetic_events(plain), *reports]
        assert post_events(servers.api_url, events) == len(events)
        yield servers.ui_url or ""


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with chromium_page() as opened:
        yield opened


def test_the_panel_names_the_damaged_node_and_reads_each_nodes_figures(
    ui_url: str, page: Page
) -> None:
    page.goto(page_url(ui_url, "throughput", "cached"))
    expect(page.get_by_text("Node cache", exact=True)).to_be_visible(timeout=LOAD_S)
    expect(
        page.get_by_text("node1 (/nvme/cache) fetched 40 % of its bytes from the store")
    ).to_be_visible()
    expect(
        page.get_by_text(
            "node1 (/nvme/cache): 2 cached files were damaged or missing and fetched again"
        )
    ).to_be_visible()
    expect(page.get_by_text("node0 (/nvme/cache)")).to_have_count(0)  # healthy: no warning
    table = page.get_by_test_id("stTable").last
    healthy = table.locator("tr", has_text="node0 · /nvme/cache").inner_text().split("\t")
    damaged = table.locator("tr", has_text="node1 · /nvme/cache").inner_text().split("\t")
    cells = ["95.0%", "50.0 MiB", "950.0 MiB", "5%", "3", "0", "48", "6 steps"]
    assert [c.strip() for c in healthy[1:9]] == cells
    cells = ["60.0%", "400.0 MiB", "600.0 MiB", "40%", "120", "2", "0", "—"]
    assert [c.strip() for c in damaged[1:9]] == cells
    assert "(stale)" not in healthy[9]
    page.get_by_text("Node cache", exact=True).scroll_into_view_if_needed()
    _shot(page, "dashboard-cache.png")


def test_a_run_without_a_cache_says_so(ui_url: str, page: Page) -> None:
    page.goto(page_url(ui_url, "throughput", "plain"))
    expect(page.get_by_text("This run reported no node cache.")).to_be_visible(timeout=LOAD_S)
    expect(page.get_by_test_id("stAlert").filter(has_text="store")).to_have_count(0)
