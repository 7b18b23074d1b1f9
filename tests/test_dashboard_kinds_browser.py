"""Headless Chromium reads what the pages SAY about each kind of run (issue 25): a mixture,
a packed mixture, a run resized 4 -> 3, a crash under `torch.multiprocessing` and a 1,024-rank
synthetic run (rows and packed single datasets: tests/test_dashboard_browser.py).

One collector + Streamlit server and one browser for the module. The runs come from REAL
loaders reporting to the collector (tests/kinds_feed.py: `rank=`/`world_size=` loaders in
this process; tests/mp_crash_job.py: three spawned ranks, rank 1 SIGKILLed, the others
SIGTERMed by `torch.multiprocessing`), except the 1,024-rank run (dashboard/synthetic.py).
Each test asserts the words and numbers a user reads: the headline state, counts, tokens,
per-dataset shares, who crashed, the resize's ranks before and after.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from dashboard.launch import start_dashboard
from dashboard.synthetic import SyntheticRun, post_events, synthetic_events
from tests.kinds_feed import mixture_run, resized_run
from tests.net import get_json
from tests.test_dashboard_browser import _shot, chromium_page, page_url

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

LOAD_S = 30_000  # ms: the first render of a page on a loaded machine


@dataclass
class Runs:
    """The servers, the crash job and what the loaders of each run read."""

    ui_url: str
    api_url: str
    crash: subprocess.Popen[bytes]
    facts: dict[str, dict[str, Any]]

    def url(self, page: str, run: str) -> str:
        return page_url(self.ui_url, page, run)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    folder = tmp_path_factory.mktemp("kinds")
    with start_dashboard(port=0, ui_port=0, db=str(folder / "kinds.db")) as servers:
        api = servers.api_url
        crash = subprocess.Popen(  # its three ranks import torch meanwhile
            [sys.executable, "-m", "tests.mp_crash_job", api, "mp-crash", str(folder)],
            cwd=Path(__file__).parent.parent,
        )
        try:
            facts = {
                "mixed": mixture_run(api, "mixed", 31, packed=False),
                "packed-mix": mixture_run(api, "packed-mix", 12, packed=True),
                "resized": resized_run(api, "resized", folder),
            }
            yield Runs(servers.ui_url or "", api, crash, facts)
        finally:
            crash.kill()
            crash.wait(10)


@pytest.fixture(scope="module")
def page(runs: Runs) -> Iterator[Page]:
    with chromium_page() as opened:
        yield opened


def _row(page: Page, name: str, nth: int = 0) -> Any:
    return page.get_by_test_id("stTable").nth(nth).locator("tr", has_text=name)


def test_a_mixture_progress_reads_its_last_step_and_shares(runs: Runs, page: Page) -> None:
    """31 steps of 8 rows at 3:1, closed after 2 epochs were stated: 186 web and 62 code rows
    (not the first report's 0 and 0), shares 75 % and 25 %, the run stopped early."""
    page.goto(runs.url("progress", "mixed"))
    expect(
        page.get_by_text("Stopped: all 2 ranks closed before the job's stated end")
    ).to_be_visible(timeout=LOAD_S)
    expect(page.get_by_text("mixture · global step 31 · 2 ranks reporting")).to_be_visible()
    expect(page.get_by_test_id("stMetricValue").filter(has_text="1 of 2")).to_be_visible()
    web, code = _row(page, "web"), _row(page, "code")
    read = runs.facts["mixed"]  # what the loaders handed out: 186 and 62
    expect(web).to_contain_text(re.compile(rf"web\s*75\.0%\s*{read['web']}\s*0\s*75\.0%\s*75\.0%"))
    expect(code).to_contain_text(re.compile(rf"code\s*25\.0%\s*{read['code']}\s*0\s*25\.0%\s*25"))
    expect(page.get_by_test_id("stException")).to_have_count(0)
    _shot(page, "kinds-mixture-progress.png")


def test_a_packed_mixture_reads_blocks_and_tokens_per_dataset(runs: Runs, page: Page) -> None:
    """12 steps of 8 blocks of 8 tokens at 3:1: 72 web blocks (576 tokens), 24 code blocks
    (192 tokens); Placement lays out the step's positions and draws no split grid."""
    page.goto(runs.url("progress", "packed-mix"))
    expect(page.get_by_text("mixture · global step 12 · 2 ranks reporting")).to_be_visible(
        timeout=LOAD_S
    )
    table = page.get_by_test_id("stTable").first
    expect(table).to_contain_text("blocks supplied")
    expect(table).not_to_contain_text("rows supplied")  # a packed mixture hands out blocks
    expect(_row(page, "web")).to_contain_text(re.compile(r"web\s*75\.0%\s*72\s*576\s*0\s*75\.0%"))
    expect(_row(page, "code")).to_contain_text(re.compile(r"code\s*25\.0%\s*24\s*192\s*0\s*25"))
    expect(page.get_by_test_id("stMetricLabel").filter(has_text="tokens/s")).to_have_count(1)
    page.goto(runs.url("", "packed-mix"))
    expect(page.get_by_text("a mixture of 2 datasets · G = 8 rows a step")).to_be_visible(
        timeout=LOAD_S
    )
    expect(_row(page, "web")).to_contain_text("rank 0: 0–2 · rank 1: 4–6")
    expect(_row(page, "code")).to_contain_text("rank 0: 3 · rank 1: 7")
    expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(0)  # no S = 10 split grid
    page.goto(runs.url("throughput", "packed-mix"))
    tokens = page.get_by_test_id("stMetric").filter(has_text="tokens/s (job, last 30 s)")
    expect(tokens).to_be_visible(timeout=LOAD_S)
    rate = tokens.get_by_test_id("stMetricValue").inner_text()
    assert int(rate.replace(",", "")) > 0, f"a packed mixture read at {rate} tokens/s"
    expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(2)
    _blocks_axis(page.get_by_test_id("stVegaLiteChart").first)
    expect(page.get_by_test_id("stException")).to_have_count(0)


def test_the_planner_opens_a_mixture_on_its_datasets(runs: Runs, page: Page) -> None:
    """Issue 33 point 12: the Planner of a mixture starts from its first dataset (web: 400
    rows, S = 3) and the mixture's G = 8, not N = S = G."""
    page.goto(runs.url("planner", "mixed"))
    expect(page.get_by_text("a mixture of 2 datasets: dataset web's N and S")).to_be_visible(
        timeout=LOAD_S
    )
    expect(page.get_by_label("rows N (after the filter)")).to_have_value("400")
    expect(page.get_by_label("splits S")).to_have_value("3")
    expect(page.get_by_label("global batch G")).to_have_value("8")


def _blocks_axis(chart: Any) -> None:
    """The rate chart's y axis (Streamlit draws Vega as SVG): titled in blocks/s, its tick
    labels plain numbers that reach above 0 (not "0.000000" from an empty band)."""
    y_axis = chart.locator("g[aria-label^='Y-axis']").first
    expect(y_axis).to_have_attribute("aria-label", re.compile(r"titled 'blocks/s per rank'"))
    expect(chart).not_to_contain_text("rows/s")
    ticks = y_axis.locator(".role-axis-label text").all_text_contents()
    values = [float(t.replace(",", "")) for t in ticks]  # a label that is not a number raises
    assert values and max(values) > 0 and "0.000000" not in ticks, ticks


def test_a_run_resized_4_to_3_reads_its_true_totals_and_ranks(runs: Runs, page: Page) -> None:
    """998 rows over S = 12 splits of L = 83 (the design drops the 2 surplus rows: an epoch
    is 996), 20 steps of G = 12 by W = 4 then 10 by W = 3: 360 of 996 rows, 36.1 %."""
    page.goto(runs.url("progress", "resized"))
    expect(
        page.get_by_text("Stopped: all 3 ranks closed before the job's stated end")
    ).to_be_visible(timeout=LOAD_S)
    expect(page.get_by_text("resumed from a checkpoint")).to_be_visible()
    expect(
        page.get_by_text(f"epoch read 36.1% · {runs.facts['resized']['rows']} of 996 rows the")
    ).to_be_visible()
    for r in range(3):
        expect(page.get_by_text(f"rank {r}: 36.1% · step 30 · closed")).to_be_visible()
    expect(page.get_by_text("rank 3:")).to_have_count(0)  # rank 3 left at the resize
    page.goto(runs.url("", "resized"))
    expect(page.get_by_text("before resume: W = 4")).to_be_visible(timeout=LOAD_S)
    expect(page.get_by_text("resized · S = 12 splits · W = 3 ranks")).to_be_visible()
    expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(2)  # before and now
    for r, owned in enumerate(("0–3", "4–7", "8–11")):
        expect(_row(page, f"rank {r}")).to_contain_text(
            re.compile(rf"closed.*{owned}.*30\s*36\.1%")
        )
    expect(_row(page, "rank 3")).to_have_count(0)
    _shot(page, "kinds-resized.png")


def test_a_crash_under_torch_multiprocessing_names_the_killed_rank(runs: Runs, page: Page) -> None:
    """Rank 1 SIGKILLed, ranks 0 and 2 SIGTERMed by the launcher right after: rank 1 is the
    cause, the other two read terminated (not crashed, not the cause)."""
    assert runs.crash.wait(240) != 0  # `ProcessExitedException: process 1 ... SIGKILL`
    page.goto(runs.url("", "mp-crash"))
    headline = page.get_by_text(re.compile(r"^Crashed: rank 1 died first"))
    try:
        expect(headline).to_be_visible(timeout=LOAD_S)
        expect(headline).to_contain_text("; ranks 0, 2 terminated after rank 1 died")
    except AssertionError as e:  # what the collector said, and what each rank sent
        status = get_json(f"{runs.api_url}/api/runs/mp-crash/status")
        closed = get_json(f"{runs.api_url}/api/runs/mp-crash/events?kind=closed")["data"]
        raise AssertionError(f"{e}\nstatus: {status}\nclosed: {closed}") from e
    expect(_row(page, "rank 1")).to_contain_text("crashed")
    for r in (0, 2):
        expect(_row(page, f"rank {r}")).to_contain_text("terminated")
    ranks = page.get_by_test_id("stTable").last.locator("tbody tr")
    expect(ranks.first).to_contain_text("rank 1")  # worst first: the crashed rank
    page.get_by_test_id("stRadio").get_by_text("rank", exact=True).click()  # sort by rank
    expect(ranks.first).to_contain_text("rank 0", timeout=LOAD_S)
    expect(ranks.last).to_contain_text("rank 2")
    page.goto(runs.url("progress", "mp-crash"))
    expect(page.get_by_text(re.compile(r"^rank 1: [\d.]+% · step 5 · crashed$"))).to_be_visible(
        timeout=LOAD_S
    )
    expect(page.get_by_text(re.compile(r"^rank 2: [\d.]+% · step 5 · terminated$"))).to_be_visible()
    expect(page.get_by_test_id("stMetricValue").filter(has_text="crashed")).to_be_visible()
    _shot(page, "kinds-mp-crash.png")


def test_1024_ranks_read_their_counts_and_the_slow_rank(runs: Runs, page: Page) -> None:
    """1,024 ranks over 4,096 splits of 100,000 rows, each rank 20 s at 2,000 rows/s: 10.0 %
    of the epoch (9.5 % before the last second arrives); rank 17 waits for data 60 % of its
    steps (DDP keeps its rows/s level)."""
    big = SyntheticRun("big-run", 1024, 4096, 100_000, 20, time.time() - 12, slow_rank=17)
    events = list(synthetic_events(big))
    last_second = events[-1024:]  # each rank's last report, sent before Placement is read:
    post_events(runs.api_url, events[:-1024])  # the collector times silence by arrival
    page.goto(runs.url("progress", "big-run"))
    expect(page.get_by_text("Running: 1,024 of 1,024 ranks reporting")).to_be_visible(
        timeout=60_000
    )
    expect(
        page.get_by_text("epoch read 9.5% · 38,912,000 of 409,600,000 rows the reporting ranks own")
    ).to_be_visible()
    expect(page.get_by_text("Ranks furthest behind")).to_be_visible()
    expect(page.get_by_text(re.compile(r"^rank \d+: "))).to_have_count(0)  # no 1,024 bars
    page.goto(runs.url("throughput", "big-run"))
    expect(page.get_by_text("Stragglers: rank 17")).to_be_visible(timeout=60_000)
    expect(_row(page, "rank 17")).to_contain_text(re.compile(r"rank 17\s*2,000\s*60%"))
    _post_ahead(runs.api_url, last_second)
    page.goto(runs.url("", "big-run"))
    expect(page.get_by_text("big-run · S = 4,096 splits · W = 1,024 ranks")).to_be_visible(
        timeout=60_000
    )
    expect(page.get_by_text("1,024 of 1,024 ranks · click a column's header")).to_be_visible()
    per_node = page.get_by_test_id("stTable").first  # 128 nodes of 8 ranks, none behind
    expect(per_node.locator("tr", has_text="16–23")).to_contain_text(
        re.compile(r"node2\s*16–23\s*64–95\s*8 running\s*10\.0% / 10\.0% / 10\.0%(\s*—){4}")
    )
    first = _grid_row(page, 0)  # worst first: all running, so rank 0
    expect(first).to_contain_text(re.compile(r"^0\s*running.*node0.*0–3\s*1250\s*10\s*2000"))
    _shot(page, "kinds-1024.png")
    _find(page, "17")
    expect(page.get_by_text("1 of 1,024 ranks match “17”")).to_be_visible(timeout=LOAD_S)
    expect(_grid_row(page, 0)).to_contain_text(re.compile(r"^17\s*running.*68–71"))


def _post_ahead(api_url: str, last_second: list[dict[str, Any]]) -> None:
    """Each rank's last report, from a client whose heartbeat is 10 s: the collector judges
    silence by arrival, in beats, so the ranks read running for 100 s after this post however
    long a loaded machine takes to draw the pages (at the feed's 1 s beat, 10-20 s)."""
    ahead = time.time() + 60 - last_second[-1]["ts"]
    post_events(api_url, [e | {"ts": e["ts"] + ahead, "heartbeat_s": 10.0} for e in last_second])


def _grid_row(page: Page, n: int) -> Any:
    """Row `n` of the ranks grid (`st.dataframe`) as its accessible table has it."""
    return page.get_by_test_id("stDataFrame").last.locator("tbody tr").nth(n)


def _find(page: Page, text: str) -> None:
    find = page.get_by_label("find a rank, host or state")
    find.fill(text)
    find.press("Enter")


def test_1024_ranks_with_stragglers_and_a_crash_name_them_per_node(runs: Runs, page: Page) -> None:
    """1,024 ranks, 8 a node, 4 splits of 100,000 rows each, 40 s at 2,000 rows/s: 20.0 % read;
    ranks 77, 300 and 301 read at half the rate (10.0 %: behind), rank 500 went silent after
    5 s (2.5 %, crashed). Placement names them on their nodes, those nodes first, draws one
    node's ranks, and its ranks table finds and sorts them: no page spinner."""
    run = SyntheticRun(
        "big-crash", 1024, 4096, 100_000, 40, time.time() - 41,
        behind_ranks=(77, 300, 301), crashed_rank=500, crash_at=5,
    )  # fmt: skip
    events = list(synthetic_events(run))
    post_events(runs.api_url, events[:-1023])
    _post_ahead(runs.api_url, events[-1023:])  # every rank but 500 reports
    page.goto(runs.url("", "big-crash"))
    expect(page.get_by_text(re.compile(r"^Crashed: rank 500"))).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Nodes, worst first")).to_be_visible(timeout=LOAD_S)
    nodes = page.get_by_test_id("stTable").first.locator("tbody tr")
    expect(nodes).to_have_count(128, timeout=LOAD_S)
    expect(nodes.nth(0)).to_contain_text(
        re.compile(
            r"node62\s*496–503\s*1984–2015\s*1 crashed · 7 running\s*2\.5% / 20\.0% / 20\.0%"
            r"\s*rank 500 \(2\.5%\)\s*—\s*—\s*—"
        )
    )
    expect(nodes.nth(1)).to_contain_text(
        re.compile(r"node9\s*72–79\s*288–319.*rank 77 \(10\.0%\)$")
    )
    expect(nodes.nth(2)).to_contain_text(
        re.compile(r"node37\s*296–303.*rank 300 \(10\.0%\), rank 301 \(10\.0%\)$")
    )
    expect(nodes.nth(3)).to_contain_text(re.compile(r"node0\s*0–7\s*0–31\s*8 running"))
    crashed_cell = nodes.nth(0).locator("td", has_text="rank 500")
    expect(crashed_cell).to_have_css("background-color", "rgb(213, 94, 0)")  # vermillion
    pick = page.get_by_role("combobox", name="the ranks and splits of node")
    expect(pick).to_have_count(1)  # the worst node drawn, rank by rank:
    drawn = page.get_by_test_id("stVegaLiteChart")
    expect(drawn).to_contain_text("node62: ranks 496–503 · splits 1984–2015", timeout=LOAD_S)
    expect(drawn).to_contain_text(re.compile(r"rank 496.*rank 500.*rank 503"))
    expect(drawn).to_contain_text(re.compile(r"split\s*running\s*crashed\s*state"))  # legend
    expect(page.get_by_test_id("stVegaLiteChart")).to_have_count(1)  # one node, not 4,096 cells
    svg = drawn.locator("canvas, svg.marks").first
    svg.wait_for(timeout=LOAD_S)
    box, outer = svg.bounding_box(), drawn.bounding_box()
    assert box and outer and box["x"] + box["width"] <= min(1400, outer["x"] + outer["width"]) + 1
    expect(page.get_by_text("1,024 of 1,024 ranks · click a column's header")).to_be_visible()
    expect(_grid_row(page, 0)).to_contain_text(re.compile(r"^500\s*crashed.*node62.*2000–2003"))
    expect(page.get_by_test_id("stNumberInput")).to_have_count(0)  # no page spinner
    _shot(page, "kinds-1024-crash.png")
    pick.click()
    page.keyboard.type("node37")  # the select box filters its 128 nodes as one types
    page.get_by_role("option", name="node37", exact=True).click()
    expect(drawn).to_contain_text("node37: ranks 296–303 · splits 1184–1215", timeout=LOAD_S)
    expect(drawn).to_contain_text(re.compile(r"split\s*running\s*behind\s*state"))
    _find(page, "300")
    expect(page.get_by_text("1 of 1,024 ranks match “300”")).to_be_visible(timeout=LOAD_S)
    expect(_grid_row(page, 0)).to_contain_text(re.compile(r"^300\s*running.*node37.*1200–1203"))
    _find(page, "crashed")
    expect(page.get_by_text("1 of 1,024 ranks match “crashed”")).to_be_visible(timeout=LOAD_S)
    expect(_grid_row(page, 0)).to_contain_text(re.compile(r"^500\s*crashed"))
    _find(page, "")
    expect(page.get_by_text("1,024 of 1,024 ranks · click")).to_be_visible(timeout=LOAD_S)
    page.get_by_test_id("stRadio").get_by_text("rank", exact=True).click()  # sort by rank
    expect(_grid_row(page, 0)).to_contain_text(re.compile(r"^0\s*running"), timeout=LOAD_S)
    expect(_grid_row(page, 1)).to_contain_text(re.compile(r"^1\s*running"))
    page.get_by_test_id("stRadio").get_by_text("read", exact=True).click()  # least read first
    expect(_grid_row(page, 0)).to_contain_text(re.compile(r"^500\s*crashed"), timeout=LOAD_S)
    expect(_grid_row(page, 1)).to_contain_text(re.compile(r"^77\s*running"))
    expect(_grid_row(page, 3)).to_contain_text(re.compile(r"^301\s*running"))
