"""Run and rank state from heartbeats, outages and job progress, through the collector's API.

Synthetic runs whose last reports lie at chosen distances in the past: the collector's
clock decides, as in production (stalled after 5 send intervals, crashed after 15).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.collector.throughput import _band, _segments
from dashboard.collector.views import gpu_labels
from dashboard.synthetic import SyntheticRun, synthetic_events
from tests.collector_api import collector_client, post, post_runs, view


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "s.db") as c:
        yield c


def test_states_from_heartbeats(client: TestClient) -> None:
    now = time.time()
    ended_ago = {"live": 0, "stalled": 14, "crashed": 40, "finished": 40, "stopped": 40}
    runs = {
        name: SyntheticRun(
            name, 4, 16, 10_000, 20, now - 20 - ago,
            closed=name in ("finished", "stopped"),
            total_epochs={"finished": 1, "stopped": 3}.get(name),
        )
        for name, ago in ended_ago.items()
    }  # fmt: skip
    post_runs(client, *runs.values())
    for name in runs:
        status = view(client, name, "status")
        expected = "running" if name == "live" else name
        assert status["state"] == expected, (name, status["headline"])
    crashed = view(client, "crashed", "status")
    assert crashed["headline"].startswith("Crashed: every rank stopped reporting without closing")
    assert all(r["state"] == "crashed" and r["silent_s"] >= 39 for r in crashed["ranks"])

    progress = view(client, "crashed", "progress")
    assert progress["rows_per_s"] == 0 and progress["eta_s"] is None  # no speed from the dead
    last_step = 20 * 2000 // 32
    labels = [i["label"] for i in view(client, "crashed", "timeline")["data"]]
    assert f"crashed: every rank stopped reporting after step {last_step:,}" in labels
    assert view(client, "crashed", "throughput")["crashed_at"] == pytest.approx(now - 40, abs=1)
    assert view(client, "live", "throughput")["crashed_at"] is None
    placement = view(client, "crashed", "placement")
    assert {r["state"] for r in placement["current"]["ranks"]} == {"crashed"}

    assert view(client, "live", "progress")["rows_per_s"] == pytest.approx(4 * 2000)
    stopped = view(client, "stopped", "progress")["job"]
    assert stopped["label"] == "epoch 1 of 3" and 0 < stopped["pct"] < 100 / 3
    finished = view(client, "finished", "progress")
    assert finished["job"]["label"] == "epoch 1 of 1" and finished["job"]["eta_s"] == 0
    assert finished["eta_s"] == 0


def test_an_outage_is_a_gap_not_a_line(client: TestClient) -> None:
    now = time.time()
    first = SyntheticRun("gap", 2, 8, 1_000_000, 20, now - 80)
    second = SyntheticRun("gap", 2, 8, 1_000_000, 20, now - 20, start_rows=40_000)
    post_runs(client, first, second)
    band = view(client, "gap", "throughput")["band"]
    assert {p["segment"] for p in band} == {0, 1}
    silent = [p for p in band if now - 60 + 1 < p["t"] < now - 20 - 3]  # 3 s buckets
    assert silent == []  # no point inside the outage: the chart draws two segments
    outages = [i for i in view(client, "gap", "timeline")["data"] if i["kind"] == "outage"]
    assert len(outages) == 1
    assert outages[0]["ts"] >= now - 60 - 10 and outages[0]["end_ts"] <= now - 20 + 10
    assert outages[0]["label"].startswith("no reports for")


def test_input_bound_verdict_names_the_waiting_ranks(client: TestClient) -> None:
    post_runs(client, SyntheticRun("io", 8, 16, 10**6, 20, time.time() - 20, slow_rank=3))
    verdict = view(client, "io", "throughput")["input"]
    assert verdict["bound"] == [3] and verdict["verdict"] == "input-bound on rank 3"
    assert verdict["ranks"][0] == {"rank": 3, "wait_share": pytest.approx(0.6)}
    assert verdict["job_share"] == pytest.approx(0.02)


def test_gpu_column_under_a_launcher_without_local_rank() -> None:
    ranks = [{"rank": r, "host": "a" if r < 3 else "b", "local_rank": 0} for r in range(5)]
    assert gpu_labels(ranks) == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1}
    torchrun = [{"rank": r, "host": "a", "local_rank": 3 - r} for r in range(4)]
    assert gpu_labels(torchrun) == {0: 3, 1: 2, 2: 1, 3: 0}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 7), st.floats(0, 1e6), st.floats(0, 1)),
        min_size=1,
        max_size=120,
    ),
    st.sampled_from([1, 3, 10]),
)
def test_band_is_min_median_max_per_bucket_and_breaks_at_gaps(
    samples: list[tuple[int, int, float, float]], bucket: int
) -> None:
    rows = [(rank, t * bucket, rows, 0, wait, 1.0) for t, rank, rows, wait in samples]
    band = _segments(_band(rows), bucket)
    by_t: dict[float, list[float]] = {}
    for _, t, done, _, _, _ in rows:
        by_t.setdefault(float(t), []).append(done)
    assert [p["t"] for p in band] == sorted(by_t)
    for point in band:
        rates = by_t[point["t"]]
        assert point["ranks"] == len(rates)
        assert (point["min"], point["max"]) == (min(rates), max(rates))
        assert point["median"] == pytest.approx(statistics.median(rates))
    for before, after in itertools.pairwise(band):
        gap = after["t"] - before["t"] > bucket
        assert after["segment"] == before["segment"] + gap


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.data())
def test_the_headline_is_the_bars(
    tmp_path_factory: pytest.TempPathFactory, world: int, data: st.DataObject
) -> None:
    per_split, num_splits, now = 100, 8, time.time()
    events = []
    for rank in range(world):
        lo, hi = rank * num_splits // world, (rank + 1) * num_splits // world
        cursors = data.draw(st.lists(st.integers(0, per_split), min_size=hi - lo, max_size=hi - lo))
        epoch = data.draw(st.integers(0, 3))
        events.append(
            {"run_id": "h", "kind": "progress", "ts": now, "rank": rank, "world_size": world}
            | {"num_splits": num_splits, "rows_per_split": per_split, "epoch": epoch}
            | {"splits": [lo, hi], "cursors": cursors, "interval_s": 1.0}
        )
    with collector_client(tmp_path_factory.mktemp("headline") / "h.db") as client:
        assert post(client, events).status_code == 202
        progress = view(client, "h", "progress")
    bars = [r["pct"] for r in progress["ranks"]]
    assert progress["epoch_pct"] == pytest.approx(statistics.fmean(bars))  # equal shares
    assert progress["rows_done"] == sum(sum(e["cursors"]) for e in events)


_PROGRESS_ONLY = ("splits", "cursors", "rows", "batches", "wait_s", "interval_s", "rows_per_s")


def _killed_job(client: TestClient, run_id: str, start: float) -> int:
    """3 ranks, checkpoints every 5 s; rank 1 dies after 8 s, ranks 0 and 2 step on to 12 s
    (a checkpoint at 10 s) and are SIGTERMed: their last global step."""
    first = SyntheticRun(run_id, 3, 6, 100_000, 12, start, crashed_rank=1, crash_at=8,
                         checkpoint_every=5)  # fmt: skip
    events = list(synthetic_events(first))
    last = {r: max((e for e in events if e["rank"] == r), key=lambda e: e["ts"]) for r in (0, 2)}
    for ev in last.values():
        said = {"reason": "terminated", "signal": "SIGTERM"}
        closed = {"kind": "closed", "ts": ev["ts"] + 0.5, "data": said}
        events.append({k: v for k, v in ev.items() if k not in _PROGRESS_ONLY} | closed)
    assert post(client, events).status_code == 202
    return max(e["global_step"] for e in last.values())


def test_a_crash_is_drawn_after_the_checkpoints_its_peers_saved(client: TestClient) -> None:
    """Issue 33 point 14: rank 1 last reported at 8 s; ranks 0 and 2, which wait for it at
    every step, saved a checkpoint at 10 s: it died after that save, so the crash follows
    it on the Timeline and says how far the others stepped."""
    step = _killed_job(client, "killed", time.time() - 30)
    items = view(client, "killed", "timeline")["data"]
    kinds = [i["kind"] for i in items]
    crash = items[kinds.index("crash")]
    saved = [i for i in items if i["kind"] == "checkpoint_saved"]
    assert saved[-1]["step"] > crash["step"]  # saved after rank 1's last report
    assert kinds.index("crash") > max(i for i, k in enumerate(kinds) if k == "checkpoint_saved")
    assert crash["label"].endswith(f"; the others stepped on to step {step:,}"), crash["label"]


def test_a_crash_then_sigterm_then_resume_keeps_every_marker(client: TestClient) -> None:
    """Issue 33 point 14: rank 1 of 3 dies, the launcher SIGTERMs ranks 0 and 2, the job
    resumes on W = 2. The Timeline marks the SIGTERM (ranks, signal, step), and after the
    resume the Throughput chart keeps the crash's rule."""
    now = time.time()
    step = _killed_job(client, "sig", now - 60)
    resumed = SyntheticRun("sig", 2, 6, 100_000, 20, now - 30, world_size_before=3)
    post_runs(client, resumed)
    labels = [i["label"] for i in view(client, "sig", "timeline")["data"]]
    assert f"terminated by SIGTERM: ranks 0, 2 at step {step:,}" in labels, labels
    throughput = view(client, "sig", "throughput", window_s=600)
    assert throughput["crashed_at"] is None  # the resumed world runs
    assert len(throughput["crashed_before"]) == 1
    assert now - 60 + 7 <= throughput["crashed_before"][0] <= now - 60 + 13
