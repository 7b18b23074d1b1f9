"""Liveness on the collector's clock of receipt, and idempotent events (issue 33 items 7, 8).

Each case is a run ingested into a real store at chosen receipt times (`Store.ingest(now=)`)
and judged by the status rules at a chosen time: the sender's clock is the one that lies.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.collector.metrics import scrape
from dashboard.collector.models import EventIn
from dashboard.collector.status import DEFAULT_HEALTH, run_status
from dashboard.collector.store import Store
from loader import wire
from tests.collector_api import collector_client, post

T0 = 1.7e9  # true time 0 (the collector's clock is right)


class Process:
    """One process sending a progress batch a second, its clock `skew` seconds off."""

    def __init__(self, store: Store | None, rank: int, world: int = 1, skew: float = 0.0) -> None:
        self.store, self.rank, self.world, self.skew = store, rank, world, skew
        self.seq, self.step = 0, 0
        self.last: list[EventIn] = []

    def event(self, t: float, **fields: Any) -> dict[str, Any]:
        ev = {"run_id": "r", "kind": wire.PROGRESS, "ts": T0 + t + self.skew, "rank": self.rank}
        ev |= {"world_size": self.world, "num_splits": 4, "rows_per_split": 100}
        ev |= {"incarnation": f"{self.rank + 1:032x}", "seq": self.seq, "heartbeat_s": 1.0}
        ev |= {"epoch": 0, "step": self.step, "global_step": self.step, "interval_s": 1.0}
        ev |= {"rows": 1, "batches": 1, "sent_ts": T0 + t + self.skew}
        self.seq += 1
        return ev | fields

    def send(self, t: float, **fields: Any) -> None:
        """One batch leaving at true time `t`, received 10 ms later."""
        self.step += 1
        self.last = [EventIn.model_validate(self.event(t, **fields), strict=False)]
        assert self.store is not None
        self.store.ingest(self.last, now=T0 + t + 0.01)

    def beats(self, start: float, stop: float) -> None:
        for t in range(int(start), int(stop)):
            self.send(float(t))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "c.db")
    yield s
    s.close()


def judge(store: Store, t: float) -> dict[str, Any]:
    run = store.run("r")
    assert run is not None
    return run_status(store, run, now=T0 + t)


def test_a_zero_sent_ts_does_not_keep_a_dead_rank_running(store: Store) -> None:
    rank = Process(store, 0)
    rank.beats(0, 10)
    rank.send(10.0, sent_ts=0.0)  # then it dies
    status = judge(store, 10.0 + DEFAULT_HEALTH.crashed_after + 5)
    assert status["state"] == "crashed", status["headline"]


def test_a_heartbeat_from_the_future_does_not_make_a_live_rank_crashed(store: Store) -> None:
    rank = Process(store, 0)
    rank.beats(0, 10)
    rank.send(10.0, ts=T0 + 250.0, sent_ts=T0 + 250.0)  # 4 min ahead, once
    rank.beats(11, 60)
    status = judge(store, 60.0)
    assert status["state"] == "running", status["headline"]
    assert status["ranks"][0]["global_step"] == rank.step


def test_a_clock_stepped_back_keeps_reporting_running(store: Store) -> None:
    rank = Process(store, 0)
    rank.beats(0, 10)
    rank.skew = -3600.0  # NTP steps its clock back an hour
    rank.beats(10, 60)
    status = judge(store, 60.0)
    assert status["state"] == "running", status["headline"]
    assert status["ranks"][0]["global_step"] == rank.step  # its newer reports were kept


def test_with_one_clock_skewed_the_first_to_die_is_named(store: Store) -> None:
    """Rank 0's clock is a minute behind: by its own timestamps it 'died' first; by receipt
    rank 1 died 5 s before it."""
    early, late = Process(store, 1, world=2), Process(store, 0, world=2, skew=-60.0)
    for t in range(20):
        late.send(float(t))
        if t < 15:
            early.send(float(t))
    status = judge(store, 60.0)
    assert status["state"] == "crashed"
    first = [r["process"] for r in status["ranks"] if r["first"]]
    assert first == [1], status["headline"]
    assert "rank 1" in status["headline"], status["headline"]


def test_a_run_an_hour_behind_stays_in_metrics_and_its_crash_alert_fires(store: Store) -> None:
    rank = Process(store, 0, skew=-3600.0)
    rank.beats(0, 30)
    live = scrape(store, DEFAULT_HEALTH, now=T0 + 30.0).decode()
    assert 'elastic_loader_run_state{run_id="r",state="running"} 1.0' in live
    dead = scrape(store, DEFAULT_HEALTH, now=T0 + 60.0).decode()
    assert 'elastic_loader_run_state{run_id="r",state="crashed"} 1.0' in dead


def test_a_dead_ranks_last_batch_replayed_changes_nothing(store: Store) -> None:
    rank = Process(store, 0)
    rank.beats(0, 10)
    count = store.count()
    assert store.ingest(rank.last, now=T0 + 40.0) == 0  # byte for byte, 30 s after its death
    assert store.count() == count
    status = judge(store, 41.0)
    assert status["state"] == "crashed", status["headline"]
    assert status["ranks"][0]["silent_s"] == pytest.approx(41.0 - 9.01)


def test_an_older_number_changes_nothing_a_new_client_is_new(store: Store) -> None:
    rank = Process(store, 0)
    rank.beats(0, 10)
    stale = rank.event(10.0, seq=3, step=99, global_step=99)
    assert store.ingest([EventIn.model_validate(stale, strict=False)], now=T0 + 10.01) == 0
    assert judge(store, 10.5)["ranks"][0]["global_step"] == rank.step
    restarted = Process(store, 0)  # another incarnation numbers from 0 again
    restarted.seq, restarted.step = 0, 0
    restarted.send(11.0, incarnation="ab" * 16)
    assert judge(store, 11.5)["ranks"][0]["global_step"] == 1


def test_the_route_counts_duplicates_and_takes_old_clients_as_they_come(tmp_path: Path) -> None:
    """Through HTTP: a repeat is accepted and counted as a duplicate; events without `seq`
    (clients older than it) are stored every time (best effort)."""
    ev = Process(None, 0).event(0.0) | {"ts": time.time(), "sent_ts": time.time()}
    with collector_client(tmp_path / "h.db") as c_:
        assert post(c_, [ev]).json() == {"accepted": 1, "duplicates": 0}
        assert post(c_, [ev]).json() == {"accepted": 1, "duplicates": 1}
        old = {k: v for k, v in ev.items() if k not in ("seq", "incarnation")}
        assert post(c_, [old]).json() == {"accepted": 1, "duplicates": 0}
        assert post(c_, [old]).json() == {"accepted": 1, "duplicates": 0}
        half = {k: v for k, v in ev.items() if k != "incarnation"}
        refused = post(c_, [half])
        assert refused.status_code == 422
        assert "seq and incarnation" in refused.text
