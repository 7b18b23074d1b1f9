"""The run-health rules of issue #19 (items 6, 8, 9, 10 and "finished shown as crashed"):
each a small run whose reports lie at chosen times before `NOW`, judged at `NOW` (the
status is computed with an injected clock; nothing waits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from dashboard import launch
from dashboard.collector import views
from dashboard.collector.status import Health, run_status
from dashboard.collector.store import Store
from loader import wire
from tests.collector_api import collector_client, post, view

NOW = float(int(time.time()))
S, L = 4, 10


def event(kind: str, ago: float, rank: int = 0, world: int = 1, **fields: Any) -> dict[str, Any]:
    """One event of run `fields.pop("run_id", "r")`, `ago` seconds before NOW."""
    ev = {"run_id": "r", "kind": kind, "ts": NOW - ago, "rank": rank, "world_size": world}
    ev |= {"num_splits": S, "rows_per_split": L}
    return ev | fields


def beats(
    first: float, last: float, rank: int = 0, world: int = 1, step: int | None = 0, **fields: Any
) -> list[dict[str, Any]]:
    """A progress event every second from `first` to `last` seconds ago; the global step
    advances by one each time from `step` (None: it stays at 0)."""
    out = []
    k = S // world
    for i, ago in enumerate(range(int(first), int(last) - 1, -1)):
        at = step + i if step is not None else 0
        position = {"epoch": 0, "step": at, "global_step": at, "interval_s": 1.0}
        position |= {"batches": int(step is not None), "rows": 4 * int(step is not None)}
        position |= {"splits": [rank * k, rank * k + k], "cursors": [min(L, at)] * k}
        out.append(event(wire.PROGRESS, ago, rank, world, **(position | fields)))
    return out


def closed(ago: float, reason: str, rank: int = 0, world: int = 1, **fields: Any) -> Any:
    data = {"reason": reason} | fields.pop("data", {})
    return event(wire.CLOSED, ago, rank, world, data=data, **fields)


@pytest.fixture(autouse=True)
def _now() -> None:
    """NOW is each test's start: the views the routes compute run on the real clock."""
    global NOW
    NOW = float(int(time.time()))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with collector_client(tmp_path / "health.db") as c:
        yield c


def judge(client: TestClient, events: list[dict[str, Any]], **health: Any) -> dict[str, Any]:
    """Ingest `events`, then the run's status at NOW."""
    assert post(client, events).status_code == 202
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    run = store.run(events[0]["run_id"])
    assert run is not None
    return run_status(store, run, health=Health(**health), now=NOW)


def test_a_rank_that_reports_but_does_not_step_is_stalled(client: TestClient) -> None:
    """Item 6: a hung collective keeps the heartbeat thread going; the step stops."""
    stuck = beats(200, 0, step=None)  # every second, always global step 0
    status = judge(client, stuck)
    assert status["state"] == "stalled"
    assert status["headline"] == "Stalled: every rank reporting, but no step for 200 s"
    assert status["ranks"][0]["why"] == "no step"
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    run = store.run("r")
    assert run is not None
    assert run_status(store, run, health=Health(no_step_s=300), now=NOW)["state"] == "running"
    stepping = [e | {"run_id": "s"} for e in beats(200, 0)]
    assert judge(client, stepping)["state"] == "running"


def test_the_stall_threshold_is_a_setting(tmp_path: Path) -> None:
    """Through the route, so on the collector's clock: the reports end now."""
    late = time.time() - NOW
    stuck = [e | {"ts": e["ts"] + late} for e in beats(60, 0, step=None)]
    with collector_client(tmp_path / "s.db", stall_after_s=30) as c:
        assert post(c, stuck).status_code == 202
        assert view(c, "r", "status")["state"] == "stalled"
    with collector_client(tmp_path / "t.db") as c:  # the default: 120 s
        assert post(c, stuck).status_code == 202
        assert view(c, "r", "status")["state"] == "running"


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf"])
def test_a_bad_stall_after_names_the_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        launch.main(["--stall-after", value])
    assert exit_.value.code == 2
    assert "--stall-after" in capsys.readouterr().err


def test_an_uncaught_exception_reads_crashed(client: TestClient) -> None:
    """Item 8: the at-exit `closed` of a process dying of an exception says so."""
    error = closed(9.5, wire.CLOSE_REASON_ERROR, data={"error": "ValueError"}, step=3)
    status = judge(client, [*beats(20, 10), error])
    assert status["state"] == "crashed"
    assert status["headline"] == "Crashed: every rank ended on an uncaught ValueError"
    labels = [i["label"] for i in view(client, "r", "timeline")["data"]]
    assert any(label.startswith("crashed: every rank") for label in labels)


def test_closing_three_steps_into_the_only_epoch_is_stopped(client: TestClient) -> None:
    """Item 8: total_epochs=1, closed 3 steps in: not Finished, 100 %, ETA 0."""
    run = [e | {"total_epochs": 1} for e in [*beats(13, 11), closed(10.5, "exit")]]
    assert judge(client, run)["state"] == "stopped"
    progress = view(client, "r", "progress")
    assert progress["job"]["pct"] < 100 and progress["job"]["eta_s"] != 0


def test_a_loader_rebuilt_every_epoch_is_still_running(client: TestClient) -> None:
    """Item 8: each epoch's loader closes its client (`close`) and the next one reports."""
    rebuilt = [*beats(10, 2), closed(1.5, "close"), *beats(0.5, 0.5, step=9)]
    assert judge(client, rebuilt)["state"] == "running"
    between = [e | {"run_id": "b"} for e in [*beats(10, 1), closed(0.5, "close")]]
    assert judge(client, between)["state"] == "running"  # the next loader is being built
    ended = [e | {"run_id": "e"} for e in [*beats(20, 10), closed(9.5, "close")]]
    assert judge(client, ended)["state"] == "finished"  # no loader came after it


def test_a_rank_that_never_reported_is_not_finished(client: TestClient) -> None:
    """Item 8: W = 2, rank 1 never reported, rank 0 closed: not "Finished: the rank closed"."""
    status = judge(client, [*beats(20, 10, world=2), closed(9.5, "exit", world=2)])
    assert status["state"] == "stopped" and status["missing"] == 1
    assert status["headline"] == "Stopped: the rank that reported closed; rank 1 never reported"


def test_one_long_gap_does_not_stretch_the_crash_threshold(client: TestClient) -> None:
    """Item 10: one heartbeat after a 60 s gap, then silence: crashed after ~15 s, not 15 min."""
    gap = [*beats(100, 90), *[e | {"interval_s": 60.0} for e in beats(30, 30, step=20)]]
    status = judge(client, gap)
    assert status["state"] == "crashed", status["headline"]


def test_a_stray_process_does_not_take_the_run_over(client: TestClient) -> None:
    """Item 9: a crashed W = 2 run, then a 1-rank process with the same run id."""
    crashed = [*beats(60, 40, 0, 2), *beats(60, 40, 1, 2)]
    stray = beats(5, 0, 0, 1)
    status = judge(client, [*crashed, *stray])
    assert status["state"] == "crashed" and len(status["ranks"]) == 2


def test_a_leftover_rank_of_the_old_world_does_not_flip_the_run(client: TestClient) -> None:
    """Item 9: after a resume 2 → 1, rank 1 of the old world still reports each second."""
    old = [*beats(40, 21, 0, 2), *beats(40, 0, 1, 2)]
    resume = event(wire.CHECKPOINT_LOADED, 20, 0, 1, data={"world_size_before": 2}, step=10)
    assert post(client, [*old, resume, *beats(19, 4, 0, 1, step=10)]).status_code == 202
    for ago in (3, 2, 1):  # each newer old-world event used to make W 2 current again
        assert post(client, beats(ago, ago, 1, 2, step=40)).status_code == 202
        run = client.get("/api/runs/r").json()
        assert (run["world_size"], run["prev_world_size"]) == (1, 2)
        [current] = beats(ago, ago, 0, 1, step=30 - ago)
        assert post(client, [current | {"ts": current["ts"] + 0.5}]).status_code == 202


def test_a_resume_keeps_the_crash_and_is_marked_on_the_same_w(client: TestClient) -> None:
    """Item 9: the crash before a resume stays on the timeline; same W is still a resume."""
    crash = [*beats(100, 60, 0, 2), *beats(100, 60, 1, 2)]
    resume = [
        event(wire.CHECKPOINT_LOADED, 30, r, 2, data={"world_size_before": 2}, step=10)
        for r in (0, 1)
    ]
    again = [*beats(29, 0, 0, 2, step=10), *beats(29, 0, 1, 2, step=10)]
    status = judge(client, [*crash, *resume, *again])
    assert status["state"] == "running" and status["resumed"]
    timeline = view(client, "r", "timeline")["data"]
    [before] = [i for i in timeline if i["label"].startswith("crashed before the resume")]
    assert before["ts"] == pytest.approx(NOW - 60) and before["ranks"] == 2
    assert before["label"] == "crashed before the resume: 2 of 2 ranks did not close"
    assert timeline.index(before) < [i["kind"] for i in timeline].index(wire.CHECKPOINT_LOADED)


def test_a_clean_stop_and_resume_shows_no_crash(client: TestClient) -> None:
    stopped = [*beats(100, 60), closed(59.5, "exit")]
    resume = event(wire.CHECKPOINT_LOADED, 30, data={"world_size_before": 1}, step=10)
    judge(client, [*stopped, resume, *beats(29, 0, step=10)])
    labels = [i["label"] for i in view(client, "r", "timeline")["data"]]
    assert not [label for label in labels if label.startswith("crashed before the resume")]


def _ended(rank: int, world: int, ago: float, epochs: int, **fields: Any) -> list[Any]:
    """A rank that read `epochs` epochs, its last report at the end of the last one."""
    step = 40
    last = beats(ago + 5, ago, rank, world, step=step - 5, **fields)
    done = {"epoch": epochs - 1, "step": step, "global_step": step}
    return [*last, event(wire.EPOCH_END, ago, rank, world, **done, **fields)]


def test_a_lost_closed_at_the_end_is_finished_not_crashed(client: TestClient) -> None:
    """Rank 0's final `closed` never arrived; rank 1's did: both stood at the job's end."""
    run = [*_ended(0, 2, 60, 2), *_ended(1, 2, 60, 2), closed(59.5, "exit", 1, 2)]
    status = judge(client, run)
    assert status["state"] == "finished", status["headline"]
    stated = [e | {"run_id": "t", "total_epochs": 2} for e in _ended(0, 1, 60, 2)]
    assert judge(client, stated)["state"] == "finished"  # the stated end, no close at all
    mid = [e | {"run_id": "m"} for e in [*beats(60, 40, 0, 2), *_ended(1, 2, 40, 1)]]
    mid.append(closed(39.5, "exit", 1, 2) | {"run_id": "m"})
    assert judge(client, mid)["state"] == "crashed"  # rank 0 stopped mid-epoch: a crash


def test_a_finished_run_shows_the_epochs_it_completed(client: TestClient) -> None:
    """Read epochs 0 and 1; the last position is epoch 2 at 0 %: show 2 epochs, 100 %."""
    after = {"epoch": 2, "step": 0, "global_step": 40, "splits": [0, S], "cursors": [0] * S}
    run = [*_ended(0, 1, 30, 2), event(wire.PROGRESS, 29.9, interval_s=1.0, **after)]
    assert judge(client, [*run, closed(29.8, "exit")])["state"] == "finished"
    progress = view(client, "r", "progress")
    assert progress["epochs_done"] == 2 and progress["epoch"] == 1
    assert progress["epoch_pct"] == 100.0 and progress["ranks"][0]["pct"] == 100.0
    assert progress["cursors"] == [L] * S
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    run_row = store.run("r")
    assert run_row is not None and views.progress(store, run_row)["epochs_done"] == 2


def test_a_run_closed_mid_epoch_without_a_stated_length_is_stopped_there(
    client: TestClient,
) -> None:
    """Issue 25 point 3: closed at 35 % of epoch 2 (no total_epochs) read "Finished"."""
    mid = [*beats(13, 11, epoch=1, cursors=[3, 4, 3, 4]), closed(10.5, "exit")]
    status = judge(client, mid)
    assert status["state"] == "stopped"
    assert status["stopped_at"] == "35.0 % of epoch 2"
    assert (
        status["headline"] == "Stopped at 35.0 % of epoch 2: the rank closed before the epoch's end"
    )
    read = [
        e | {"run_id": "read"}
        for e in [*beats(13, 11, epoch=1, cursors=[10] * 4), closed(10.5, "exit")]
    ]
    assert judge(client, read)["state"] == "finished"  # the epoch read to its end
