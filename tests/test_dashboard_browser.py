"""Headless Chromium opens the dashboard of a live run and finds every rank on it.

The run is live for real: four `TelemetryClient`s (ranks of W = 4) advance their cursors
from a thread while the browser watches, after a synthetic W = 8 stretch and a resume, so
the placement page must show both layouts side by side. The screenshot lands in
`tests/artifacts/` (git-ignored).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from dashboard.launch import DashboardHandle, start_dashboard
from dashboard.synthetic import SyntheticRun, post_events, synthetic_events
from loader.layout import owned_splits
from loader.telemetry import TelemetryClient

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARGS += ["--disable-component-update", "--disable-sync", "--no-first-run"]
RUN, W, S, PER_SPLIT = "live-run", 4, 16, 50_000


class LiveRanks:
    """W ranks' telemetry clients, fed batches from a thread until `stop()`."""

    def __init__(self, api_url: str) -> None:
        self.cursors = [[3000] * (S // W) for _ in range(W)]
        self.steps = [0] * W
        self.clients = []
        for r in range(W):
            static = {"rank": r, "local_rank": r, "world_size": W, "num_workers": 2}
            static |= {"num_splits": S, "rows_per_split": PER_SPLIT, "batch_size": 64}
            client = TelemetryClient(api_url, RUN, static | {"host": "gpu-node"}, interval_s=0.3)
            client.set_snapshot(self._snapshot(r))
            self.clients.append(client)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _snapshot(self, rank: int) -> Callable[[], dict[str, Any]]:
        splits = owned_splits(rank, W, S)
        lo, hi = splits.start, splits.stop
        return lambda: {
            "epoch": 1,
            "step": self.steps[rank],
            "splits": [lo, hi],
            "cursors": list(self.cursors[rank]),
        }

    def _feed(self) -> None:
        while not self._stop.wait(0.05):
            for r, client in enumerate(self.clients):
                split = self.steps[r] % (S // W)
                self.cursors[r][split] += 64
                self.steps[r] += 1
                client.on_batch(64, 0.2 if r == 3 else 0.001)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for client in self.clients:
            client.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardHandle]:
    db = tmp_path_factory.mktemp("browser") / "d.db"
    with start_dashboard(port=0, ui_port=0, db=str(db)) as handle:
        before = SyntheticRun(RUN, 8, S, PER_SPLIT, 40, time.time() - 60, checkpoint_every=20)
        post_events(handle.api_url, synthetic_events(before))
        resume = SyntheticRun(RUN, W, S, PER_SPLIT, 0, time.time() - 15, world_size_before=8)
        post_events(handle.api_url, synthetic_events(resume))
        ranks = LiveRanks(handle.api_url)
        try:
            yield handle
        finally:
            ranks.stop()


@pytest.fixture(scope="module")
def page(live: DashboardHandle) -> Iterator[Page]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def test_placement_shows_every_rank_before_and_after(live: DashboardHandle, page: Page) -> None:
    page.goto(live.ui_url or "")
    charts = page.get_by_test_id("stVegaLiteChart")
    expect(charts).to_have_count(2, timeout=30_000)  # before (W = 8) and now (W = 4)
    expect(page.get_by_text("before resume: W = 8")).to_be_visible()
    table = page.get_by_test_id("stTable")
    for r in range(W):
        owned = owned_splits(r, W, S)
        row = table.locator("tr", has_text=f"rank {r}")
        expect(row).to_contain_text(f"{owned.start}–{owned.stop - 1}", timeout=10_000)
        expect(row).to_contain_text(re.compile(r"\d+\.\d%"))
    page.wait_for_timeout(1000)  # let Vega finish drawing before the picture
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)


def test_progress_is_live_for_every_rank(live: DashboardHandle, page: Page) -> None:
    page.goto((live.ui_url or "") + "/progress")
    bars = [page.get_by_text(re.compile(rf"^rank {r}: \d+\.\d% · step \d+$")) for r in range(W)]
    for bar in bars:
        expect(bar).to_be_visible(timeout=30_000)
    first = bars[0].inner_text()
    expect(bars[0]).not_to_have_text(first, timeout=10_000)  # the fragment refreshed
    page.goto((live.ui_url or "") + "/throughput")
    expect(page.get_by_text("Stragglers: rank 3")).to_be_visible(timeout=30_000)
