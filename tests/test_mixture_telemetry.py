"""A mixture's telemetry reaches the collector: its weights and per-dataset progress in
`mixture` events at each `for` and each resume (new weights on the Timeline)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import ENV_API
from dashboard.launch import DashboardHandle
from loader import MixedDataset, StreamingDataLoader, StreamingDataset, checkpoint
from tests.batches import step_together
from tests.net import wait_until

pytestmark = pytest.mark.slow  # starts the collector

PROGRESS = Path(__file__).parent.parent / "dashboard" / "screens" / "progress.py"
PLACEMENT = PROGRESS.with_name("placement.py")


def _get(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as resp:
        return orjson.loads(resp.read())


def _page(script: Path, run_id: str, collector: DashboardHandle) -> AppTest:
    """A dashboard page run for `run_id`, with its "Datasets of the mixture" section."""
    page = AppTest.from_file(str(script), default_timeout=60)
    page.session_state["run_id"] = run_id
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_API, collector.api_url)
        page.run()
    assert not page.exception
    assert "Datasets of the mixture" in [h.value for h in page.subheader]
    return page


def loader(
    collector: DashboardHandle, rank: int, weights: list[int], run_id: str = "mix-run"
) -> StreamingDataLoader:
    kw = {"rank": rank, "world_size": 2}
    a = StreamingDataset(pa.table({"id": list(range(60))}), num_splits=3, shuffle_seed=1, **kw)
    b = StreamingDataset(
        pa.table({"id": list(range(100, 120))}), num_splits=2, shuffle_seed=2, **kw
    )
    mix = MixedDataset({"a": a, "b": b}, weights)
    return StreamingDataLoader(mix, global_batch_size=8, telemetry=collector.api_url, run_id=run_id)


def test_weights_and_per_dataset_progress_reach_the_collector(
    collector: DashboardHandle, tmp_path: Path
) -> None:
    first = [loader(collector, r, [3, 1]) for r in range(2)]
    for _ in zip(*first, strict=True):
        pass  # one epoch: a pass of b (20 rows, 2 a step)
    state = first[0].state_dict()
    checkpoint.save(state, tmp_path / "mix.json")  # on the Timeline as a single dataset's
    resumed = [loader(collector, r, [1, 1]) for r in range(2)]
    for dl in resumed:
        dl.load_state_dict(state)
    for dl in first + resumed:
        dl.close()
    url = collector.api_url + "/api/runs/mix-run/events?kind=mixture"
    deadline = time.monotonic() + 30
    while len(events := _get(url)["data"]) < 4:
        assert time.monotonic() < deadline, events
    weights = sorted({(e["global_step"], tuple(e["data"]["weights"])) for e in events})
    assert weights == [
        (0, ("3/4", "1/4")),
        (10, ("1/2", "1/2")),
    ]  # the new phase from the resumed step
    resume = [e["data"] for e in events if e["global_step"] == 10]
    assert resume[0]["supplied"] == [60, 20] and resume[0]["passes"] == [1, 1]
    assert resume[0]["phase_start"] == 10 and resume[0]["names"] == ["a", "b"]
    page = _page(PROGRESS, "mix-run", collector)
    heads = [str(e.proto.body) for e in page.get("html")]
    assert heads == ["<div><b>mixture · global step 10 · 2 ranks reporting</b></div>"]
    assert not any("0 of 0" in h for h in heads)  # no split headline of a mixture's G "splits"
    [table] = page.table
    assert list(table.value.index) == ["a", "b"]
    timeline = _get(collector.api_url + "/api/runs/mix-run/timeline")
    saved = [i for i in timeline["data"] if i["kind"] == "checkpoint_saved"]
    assert [(i["step"], i["ranks"]) for i in saved] == [(10, 2)]
    assert {item["label"] for item in timeline["data"] if item["kind"] == "mixture"} == {
        "mixture: a 3/4, b 1/4 at step 0",
        "mixture: a 1/2, b 1/2 at step 10",
    }


def test_the_progress_page_table_of_a_mixture() -> None:
    from dashboard.mixture import mixture_frame

    def event(step: int, weights: str, start: int, supplied: list[int]) -> dict[str, Any]:
        data = {"names": "web,code", "weights": weights, "phase_start": start}
        return {"global_step": step, "data": data | {"supplied": supplied, "passes": [0, 2]}}

    events = [event(0, "3/4,1/4", 0, [0, 0]), event(10, "1/2,1/2", 10, [75, 25])]
    events.append(event(20, "1/2,1/2", 10, [125, 75]))
    frame = mixture_frame(events)
    assert frame is not None
    # the last 20 steps held 10 of 3:1 and 10 of 1:1 (issue 33 point 11: not the phase's 1:1)
    assert frame.loc["web"].tolist() == ["50.0%", "125", "0", "62.5%", "50.0%"]
    assert frame.loc["code"]["share since the weights took effect"] == "50.0%"
    # 100 steps on: the last 100 steps lie in the 1:1 phase
    events += [event(115, "1/2,1/2", 10, [175, 125]), event(215, "1/2,1/2", 10, [235, 165])]
    frame = mixture_frame(events)
    assert frame is not None
    assert frame["share of the last 100 steps"].tolist() == ["50.0%", "50.0%"]
    assert frame["share since the weights took effect"].tolist() == ["53.3%", "46.7%"]  # 160 : 140
    assert mixture_frame([]) is None


def test_the_placement_of_a_mixture_is_the_rows_each_rank_reads(
    collector: DashboardHandle,
) -> None:
    """The Placement page of a mixture: per dataset, the positions of its rows in the step
    and which rank reads which, equal to the sources of the rows each rank is handed."""
    ranks = [loader(collector, r, [3, 1], run_id="mix-place") for r in range(2)]
    first = [next(iter(dl)) for dl in ranks]  # global step 0, the loaders left open: their
    url = collector.api_url + "/api/runs/mix-place/placement"  # `close` reports step 1
    deadline = time.monotonic() + 30
    while (mixture := _get(url).get("mixture")) is None:
        assert time.monotonic() < deadline, "no mixture placement"
    for dl in ranks:
        dl.close()
    assert mixture["global_step"] == 0 and mixture["rows_per_step"] == 8
    assert [(d["name"], d["weight"], d["splits"]) for d in mixture["datasets"]] == [
        ("a", "3/4", 3),
        ("b", "1/4", 2),
    ]
    placed: dict[int, dict[int, int]] = {0: {}, 1: {}}  # rank -> position -> dataset index
    for k, d in enumerate(mixture["datasets"]):
        for segment in d["segments"]:
            for part in segment["parts"]:
                for p in range(part["start"], part["stop"]):
                    placed[part["rank"]][p] = k
    for rank, batch in enumerate(first):
        got = [placed[rank][p] for p in sorted(placed[rank])]
        assert got == batch["source"].tolist()
    page = _page(PLACEMENT, "mix-place", collector)
    datasets, by_rank = page.table
    assert list(datasets.value.index) == ["a", "b"]
    assert list(datasets.value["splits"]) == ["3", "2"]
    assert list(by_rank.value["positions of each step"]) == ["0–3", "4–7"]


def test_per_dataset_progress_is_live_and_stays_off_the_timeline(
    collector: DashboardHandle,
) -> None:
    """Rank 0 of a mixture reports its per-dataset progress while batches flow (not only at
    each `for`): the Progress and Placement pages follow it, the Timeline does not list it."""
    ranks = [loader(collector, r, [3, 1], run_id="mix-live") for r in range(2)]
    for dl in ranks:
        dl._telemetry.mixture_every_s = 0.0  # type: ignore[attr-defined]  # every batch
    step_together(ranks, 5)
    url = collector.api_url + "/api/runs/mix-live/events?kind=mixture_progress"
    deadline = time.monotonic() + 30
    while not (live := _get(url)["data"]) or live[-1]["global_step"] < 5:
        assert time.monotonic() < deadline, live
    assert {e["rank"] for e in live} == {0}  # global facts: one rank sends them
    assert live[-1]["data"]["supplied"] == [30, 10]  # 5 steps of 8 rows at 3:1
    placement = _get(collector.api_url + "/api/runs/mix-live/placement")
    assert placement["mixture"]["global_step"] == 5
    from dashboard.mixture import mixture_frame

    mixture = _get(collector.api_url + "/api/runs/mix-live/events?kind=mixture")["data"]
    frame = mixture_frame(mixture + live[-1:])
    assert frame is not None and frame["rows supplied"].tolist() == ["30", "10"]
    timeline = _get(collector.api_url + "/api/runs/mix-live/timeline")["data"]
    assert [i["label"] for i in timeline if i["kind"].startswith("mixture")] == [
        "mixture: a 3/4, b 1/4 at step 0"
    ]


def test_a_mixture_closed_before_its_next_live_report_sends_its_last_one(
    collector: DashboardHandle,
) -> None:
    """Steps faster than `mixture_every_s` (the default 3 heartbeats), then `close()`: the
    Progress page must read the rows of every step read, not the `for`'s first report."""
    ranks = [loader(collector, r, [3, 1], run_id="mix-closed") for r in range(2)]
    for dl in ranks:
        dl._telemetry.mixture_every_s = float("inf")  # type: ignore[attr-defined]  # none live
    step_together(ranks, 5)  # closes every loader
    live = _get(collector.api_url + "/api/runs/mix-closed/events?kind=mixture_progress")["data"]
    assert [(e["rank"], e["global_step"], e["data"]["supplied"]) for e in live] == [
        (0, 5, [30, 10])  # 5 steps of 8 rows at 3:1, sent once, by rank 0
    ]


def test_per_dataset_metrics_for_prometheus(collector: DashboardHandle) -> None:
    """`GET /metrics` has a mixture's weight, rows supplied and passes per dataset (its
    latest report), parsed by `prometheus_client`'s own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    ranks = [loader(collector, r, [3, 1], run_id="mix-metrics") for r in range(2)]
    for dl in ranks:
        dl._telemetry.mixture_every_s = 0.0  # type: ignore[attr-defined]
    step_together(ranks, 10)  # the epoch: one pass of each (60 rows at 6 a step, 20 at 2)

    def per_dataset() -> dict[tuple[str, str], float] | None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(collector.api_url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        found = {
            (s.name, s.labels["dataset"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.labels.get("run_id") == "mix-metrics" and "dataset" in s.labels
        }
        done = found.get(("elastic_loader_mixture_rows_supplied_total", "a")) == 60
        return found if done else None

    found = wait_until(per_dataset, 30, "the mixture's metrics after its epoch of 10 steps")
    assert found[("elastic_loader_mixture_rows_supplied_total", "b")] == 20
    assert found[("elastic_loader_mixture_weight", "a")] == 0.75
    assert found[("elastic_loader_mixture_weight", "b")] == 0.25
    assert found[("elastic_loader_mixture_passes_completed", "a")] == 1
    assert found[("elastic_loader_mixture_passes_completed", "b")] == 1
