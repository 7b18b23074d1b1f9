"""A healthy run reads Running the whole time (issue 25, "Done when"): a real 2-rank job
(tests/no_flap_job.py: `torch.multiprocessing` spawn, Gloo, `StreamingDataLoader`s with
telemetry, a checkpoint every 50 steps, whose event is sent at once and used to shrink the
stall threshold below the next heartbeat's gap) reports to a collector and dashboard started
by `dashboard.launch.start_dashboard`. From the moment both ranks report, the status API,
`/metrics` and the page's headline in headless Chromium are polled every 0.3 s for 60 s
while a busy process per core loads the machine: every poll reads Running. Then the job is
told to stop; it reads to its epoch's end, closes its loaders and exits, and all three read
Finished."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from dashboard.launch import start_dashboard
from tests.net import get_bytes, get_json, wait_until
from tests.test_dashboard_browser import chromium_page, page_url

pytestmark = pytest.mark.slow  # a spawned 2-rank job, a browser, 60 s of polling

RUN, POLL_S, FOR_S = "healthy", 0.3, 60.0
START_S = 120.0  # spawned ranks import torch: 5-25 s each on a loaded 2-core machine
LOAD_MS = 30_000  # a page's first render, and a fragment's rerun, on a loaded machine


def _headline(page: Page) -> str:
    """The status line's headline as the page shows it (its first line, in bold)."""
    banner = page.get_by_test_id("stAlert").filter(has_text="last report").first
    return banner.inner_text(timeout=LOAD_MS).split(" · ")[0].strip()


def _states(metrics: str, family: str) -> set[str]:
    """The `state` label of every sample of `family` of the run whose value is 1."""
    pattern = rf'^{family}{{run_id="{RUN}",[^}}]*state="(\w+)"}} 1\.0$'
    return set(re.findall(pattern, metrics, re.MULTILINE))


def _step(metrics: str) -> float:
    """The smallest global step of the run's ranks in /metrics."""
    pattern = rf'^elastic_loader_rank_global_step{{run_id="{RUN}",rank="\d+"}} (\S+)$'
    return min(float(step) for step in re.findall(pattern, metrics, re.MULTILINE))


Reads = tuple[str, str, set[str], set[str], float]


def _reads(api: str, page: Page) -> Reads:
    """(status API headline, page headline, the run's and its processes' states in /metrics,
    the slowest rank's global step there)."""
    status = get_json(f"{api}/api/runs/{RUN}/status")
    metrics = get_bytes(f"{api}/metrics").decode()
    run, processes = (_states(metrics, f"elastic_loader_{k}_state") for k in ("run", "rank"))
    return status["headline"], _headline(page), run, processes, _step(metrics)


def _busy_cores() -> list[subprocess.Popen[bytes]]:
    """One process spinning on each core: the loaded machine the verdict must hold on."""
    spin = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(spin) for _ in range(os.cpu_count() or 2)]


def _every(period_s: float, for_s: float, poll: Callable[[], None]) -> None:
    """Call `poll` every `period_s` (at once when one ran long) until `for_s` have passed."""
    start = time.monotonic()
    tick = threading.Event()
    while time.monotonic() - start < for_s:
        began = time.monotonic()
        poll()
        tick.wait(max(0.0, period_s - (time.monotonic() - began)))  # the polling interval


def test_a_healthy_two_rank_run_reads_running_on_every_poll(tmp_path: Path) -> None:
    db = str(tmp_path / "flap.db")
    with start_dashboard(port=0, ui_port=0, db=db) as servers:
        api = servers.api_url
        job = subprocess.Popen(  # its ranks import torch while the browser starts
            [sys.executable, "-m", "tests.no_flap_job", api, RUN, str(tmp_path)],
            cwd=Path(__file__).parent.parent,
        )
        load: list[subprocess.Popen[bytes]] = []
        try:
            with chromium_page() as page:
                page.goto(page_url(servers.ui_url or "", "", RUN))
                ready = [tmp_path / f"ready-{r}" for r in range(2)]
                wait_until(lambda: all(p.exists() for p in ready), START_S, "both ranks' reports")
                expect(page.get_by_text("Running: 2 of 2 ranks reporting")).to_be_visible(
                    timeout=LOAD_MS
                )
                load = _busy_cores()
                seen: list[tuple[float, str, str, set[str], set[str], float]] = []
                start = time.monotonic()
                _every(
                    POLL_S,
                    FOR_S,
                    lambda: seen.append((time.monotonic() - start, *_reads(api, page))),
                )
                for proc in load:
                    proc.kill()
                    proc.wait(10)
                (tmp_path / "stop").touch()
                assert job.wait(START_S) == 0
                finished = "Finished: all 2 ranks closed"
                expect(page.get_by_text(re.compile(f"^{finished}"))).to_be_visible(timeout=LOAD_MS)
                end = _reads(api, page)
        finally:
            for proc in [*load, job]:
                proc.kill()
                proc.wait(10)
    # polls covered the window (their count is the machine's; 192 of 200 at load 6-10)
    assert len(seen) >= FOR_S / POLL_S / 10, f"{len(seen)} polls in {FOR_S} s"
    assert seen[-1][0] >= FOR_S - 2 * POLL_S - 5  # polled to the window's end
    bad = [
        s
        for s in seen
        if not (s[1].startswith("Running: 2 of 2") and s[2].startswith("Running: 2 of 2"))
        or s[3] != {"running"}
        or s[4] != {"running"}
    ]
    assert not bad, f"{len(bad)} of {len(seen)} polls not Running, first: {bad[:3]}"
    steps = [s[5] for s in seen]  # the ranks read all along: a step a second at least
    assert steps == sorted(steps) and steps[-1] - steps[0] >= FOR_S, steps[:: len(steps) // 10]
    assert end[0].startswith(finished) and end[1].startswith(finished), end
    assert end[2] == {"finished"} and end[3] == {"closed"}, end
