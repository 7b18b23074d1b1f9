"""A mixture's telemetry reaches the collector: its weights and per-dataset progress in
`mixture` events at each `for` and each resume (new weights on the Timeline)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import ENV_API
from dashboard.launch import DashboardHandle, start_dashboard
from loader import MixedDataset, StreamingDataLoader, StreamingDataset, checkpoint

pytestmark = pytest.mark.slow  # starts the collector

PROGRESS = Path(__file__).parent.parent / "dashboard" / "screens" / "progress.py"


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardHandle]:
    with start_dashboard(port=0, db=str(tmp_path_factory.mktemp("mixtel") / "t.db"), ui=False) as h:
        yield h


def _get(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as resp:
        return orjson.loads(resp.read())


def loader(collector: DashboardHandle, rank: int, weights: list[int]) -> StreamingDataLoader:
    kw = {"rank": rank, "world_size": 2}
    a = StreamingDataset(pa.table({"id": list(range(60))}), num_splits=3, shuffle_seed=1, **kw)
    b = StreamingDataset(
        pa.table({"id": list(range(100, 120))}), num_splits=2, shuffle_seed=2, **kw
    )
    mix = MixedDataset({"a": a, "b": b}, weights)
    return StreamingDataLoader(
        mix, global_batch_size=8, telemetry=collector.api_url, run_id="mix-run"
    )


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
    deadline = time.monotonic() + 10
    while len(events := _get(url)["data"]) < 4:
        assert time.monotonic() < deadline, events
    weights = sorted({(e["global_step"], e["data"]["weights"]) for e in events})
    assert weights == [(0, "3/4,1/4"), (10, "1/2,1/2")]  # the new phase from the resumed step
    resume = [e["data"] for e in events if e["global_step"] == 10]
    assert resume[0]["supplied"] == [60, 20] and resume[0]["passes"] == [1, 1]
    assert resume[0]["phase_start"] == 10 and resume[0]["names"] == "a,b"
    page = AppTest.from_file(str(PROGRESS), default_timeout=60)
    page.session_state["run_id"] = "mix-run"
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_API, collector.api_url)
        page.run()
    assert not page.exception
    assert "Datasets of the mixture" in [h.value for h in page.subheader]
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
    assert frame.loc["web"].tolist() == ["50.0%", "125", "0", "50.0%"]
    assert frame.loc["code"]["share since the weights took effect"] == "50.0%"
    assert mixture_frame([]) is None
