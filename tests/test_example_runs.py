"""What the collector's API says about runs shaped like the examples (issue 33 points 10-15):
REAL loaders in this process (`rank=`/`world_size=`, stepped together as DDP ranks are)
report to a REAL collector in its own process, and each test compares what every endpoint
answers with what the loaders handed out.

The mixture is rebuilt mid-run as examples/pretrain_mixture.py anneals it (state taken, the
old loader dropped without `close()`, a new one loading the state), and the loaders are
dropped at the end as a training function returns: their `closed` is sent from the garbage
collector, after the last heartbeat.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dashboard.mixture import mixture_frame
from dashboard.placement import planner_defaults
from loader import StreamingDataLoader, StreamingDataset
from tests.batches import step_through_epochs
from tests.collector_api import collector_process
from tests.kinds_feed import SEQ, mixture_build, mixture_run
from tests.net import get_bytes, get_json, wait_until

pytestmark = pytest.mark.slow  # a collector in its own process

DEADLINE_S = 60.0  # a loaded machine's last sends
LIVE = ("starting", "running", "stalled")  # a silent rank reads stalled before crashed


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with collector_process(tmp_path_factory.mktemp("runs") / "runs.db") as (_, url):
        wait_until(lambda: get_json(url + "/api/runs", otherwise=None) is not None, 60, url)
        yield url


def _view(api: str, run: str, name: str, **params: Any) -> Any:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return get_json(f"{api}/api/runs/{run}/{name}" + (f"?{query}" if query else ""))


def _ended(api: str, run: str, ranks: int) -> list[dict[str, Any]] | None:
    """The run's `closed` events once every rank's last one is in."""
    events = _view(api, run, "events", kind="closed", limit=1000)["data"]
    return events if len(events) >= ranks else None


def _settled(api: str, run: str) -> dict[str, Any] | None:
    """The run's status once no rank reads running (a closed loader may be rebuilt for
    3 beats: `Health.rebuild_grace`)."""
    status = _view(api, run, "status")
    return None if status["state"] in ("running", "starting") else status


def _annealed(api: str, run: str, steps: int, anneal_at: int, packed: bool) -> list[Any]:
    """Two ranks of web:code 3:1, rebuilt with 1:1 after `anneal_at` steps as the example
    does (no `close()`: the old loaders are dropped, and collected only once the new ones
    loaded the state); the rebuilt loaders are returned after `steps` in all, still open."""

    def loaders(weights: list[int]) -> list[StreamingDataLoader]:
        return [
            StreamingDataLoader(
                mixture_build(r, 2, packed, weights), global_batch_size=8,
                telemetry=api, run_id=run, total_steps=steps,
            )
            for r in range(2)
        ]  # fmt: skip

    old = loaders([3, 1])
    _step(old, anneal_at)
    for dl in old:  # a heartbeat with these steps is in before the anneal, as in a real run
        client, sent = dl._telemetry.client, dl._telemetry.client.sent  # type: ignore[attr-defined]
        wait_until(lambda c=client, n=sent: c.sent > n, DEADLINE_S, "a report of the steps")
    state = old[0].state_dict()
    ranks = loaders([1, 1])
    for dl in ranks:
        dl.load_state_dict(state)
    del old  # collected after the new ones loaded the state, as the example's loaders are
    gc.collect()
    _step(ranks, steps - anneal_at)
    return ranks


def _step(ranks: list[StreamingDataLoader], steps: int) -> None:
    """`steps` batches of every rank, rank by rank; no iterator outlives the call."""
    running = [iter(dl) for dl in ranks]
    for _ in range(steps):
        for it in running:
            next(it)
    del running
    gc.collect()


def test_an_annealed_mixture_run_reads_finished_at_its_last_step(api: str) -> None:
    """Point 10: the rebuild is no crash, the run finished, `closed` carries the last step."""
    ranks = _annealed(api, "annealed", steps=12, anneal_at=4, packed=False)
    del ranks  # as the training function returns: the loaders close from the collector
    gc.collect()
    closed = wait_until(lambda: _ended(api, "annealed", 4), DEADLINE_S, "every closed")
    last = sorted(closed, key=lambda e: e["ts"])[-2:]
    assert [e["global_step"] for e in last] == [12, 12], last
    rebuilt = sorted(closed, key=lambda e: e["ts"])[:2]
    assert [e["global_step"] for e in rebuilt] == [4, 4], rebuilt
    status = wait_until(lambda: _settled(api, "annealed"), DEADLINE_S, "the rebuild grace")
    assert status["state"] == "finished", status["headline"]
    labels = [i["label"] for i in _view(api, "annealed", "timeline")["data"]]
    assert not [label for label in labels if "crash" in label], labels


def test_every_endpoint_counts_what_a_packed_mixture_handed_out(api: str) -> None:
    """Point 15: progress (the run, each rank, tokens) and /metrics agree with the blocks
    and tokens the two ranks handed out."""
    steps = 30
    facts = mixture_run(api, "packed-mix", steps, packed=True)
    wait_until(lambda: _ended(api, "packed-mix", 2), DEADLINE_S, "every closed")
    blocks = facts["rows"]  # 8 blocks a step
    progress = _view(api, "packed-mix", "progress")
    assert progress["unit"] == "blocks" and progress["seq_len"] == SEQ
    assert progress["rows_done"] == blocks, progress
    assert progress["tokens_done"] == blocks * SEQ
    assert progress["rows_total"] >= blocks and progress["global_step"] == steps
    assert [b["rows_done"] for b in progress["ranks"]] == [blocks // 2] * 2
    assert sum(b["tokens"] for b in progress["ranks"]) == blocks * SEQ
    metrics = get_bytes(f"{api}/metrics").decode()
    supplied = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("elastic_loader_mixture_rows_supplied") and "packed-mix" in line
    ]
    assert supplied == [facts["web"], facts["code"]], supplied


def test_a_scheduled_weight_change_is_drawn_where_it_took_effect(api: str) -> None:
    """Point 11: a schedule's change at global step 5 (mid-epoch) is on the Timeline at step
    5, between the reports of steps 0 and 12, not at the next epoch's start."""
    ranks = [
        StreamingDataLoader(
            mixture_build(r, 2, False, [3, 1], schedule=[(5, [1, 1])]), global_batch_size=8,
            telemetry=api, run_id="scheduled",
        )
        for r in range(2)
    ]  # fmt: skip
    _step(ranks, 12)
    for dl in ranks:
        dl.close()
    wait_until(lambda: _ended(api, "scheduled", 2), DEADLINE_S, "every closed")
    items = _view(api, "scheduled", "timeline")["data"]
    mixes = [i for i in items if i["kind"] == "mixture"]
    assert [(i["step"], i["label"]) for i in mixes] == [
        (0, "mixture: web 3/4, code 1/4 at step 0"),
        (5, "mixture: web 1/2, code 1/2 at step 5"),
    ], mixes
    assert mixes[0]["ts"] <= mixes[1]["ts"]
    reports = [
        e
        for k in ("mixture", "mixture_progress")
        for e in _view(api, "scheduled", "events", kind=k)["data"]
    ]
    frame = mixture_frame(reports)
    assert frame is not None
    last = frame["share of the last 100 steps"]  # 5 steps of 6:2 rows, 7 of 4:4: 58 and 38
    assert list(last) == [f"{58 / 96:.1%}", f"{38 / 96:.1%}"], frame
    assert list(frame["rows supplied"]) == ["58", "38"]


def test_the_planner_starts_from_a_dataset_of_the_mixture(api: str) -> None:
    """Point 12: of a mixture run (web 400 rows, S = 3; code 200, S = 2; G = 8) the Planner
    starts from a dataset's N and S and the mixture's G, not N = S = G."""
    mixture_run(api, "planned", 2, packed=False)
    placement = wait_until(
        lambda: (p := _view(api, "planned", "placement"))["mixture"] and p, DEADLINE_S, "mixture"
    )
    first = planner_defaults(placement)
    assert (first["rows"], first["num_splits"], first["global_batch"]) == (400, 3, 8)
    assert first["dataset"] == "web" and "2" in first["gpus"].split(", ")
    second = planner_defaults(placement, 1)
    assert (second["rows"], second["num_splits"], second["dataset"]) == (200, 2, "code")


def test_the_synthetic_demo_reads_healthy_while_it_runs(api: str) -> None:
    """Point 14: the documented demo keeps its ranks reporting after posting its history,
    so 11 s on (past the 10 beats after which a silent rank reads stalled) every rank of
    it still reads running, whatever the posting cost on a loaded machine."""
    cmd = [sys.executable, "-m", "dashboard.synthetic", api, "--run-id", "demo"]
    cmd += ["--ranks", "64", "--splits", "256", "--seconds", "5", "--follow", "20"]
    demo = subprocess.Popen(cmd, cwd=Path(__file__).parent.parent)
    try:
        first = wait_until(lambda: _run(api, "demo"), DEADLINE_S, "the demo's history")
        wait_until(
            lambda: (_run(api, "demo") or first)["last_ts"] > first["last_ts"] + 11,
            DEADLINE_S, "11 s of live reports",
        )  # fmt: skip
        status = _view(api, "demo", "status")
        assert status["headline"] == "Running: 64 of 64 ranks reporting", status["headline"]
    finally:
        demo.kill()
        demo.wait(30)


def _run(api: str, run: str) -> dict[str, Any] | None:
    return get_json(f"{api}/api/runs/{run}", otherwise=None)


def test_a_resize_read_to_the_epoch_end_reads_every_row(api: str) -> None:
    """Point 13: S = 8 splits of L = 101 rows, G = 24 (3 rows of every split a step, so the
    epoch ends on a short step), read by W = 4 then resumed by W = 3 to the epoch's end:
    the ranks handed out all 808 rows, and Progress says 808 of 808, each rank's share
    adding up to them (not 800 from rounding the shared splits' parts down)."""

    def loaders(world: int) -> list[StreamingDataLoader]:
        table = pa.table({"id": list(range(8 * 101 + 5))})  # 5 surplus rows dropped by the plan
        return [
            StreamingDataLoader(
                StreamingDataset(table, num_splits=8, shuffle_seed=3, rank=r, world_size=world),
                global_batch_size=24, telemetry=api, run_id="resized-end", total_epochs=1,
            )
            for r in range(world)
        ]  # fmt: skip

    first = loaders(4)
    _step(first, 10)
    state = first[0].state_dict()
    for dl in first:
        dl.close()
    after = loaders(3)
    for dl in after:
        dl.load_state_dict(state)
    handed = 10 * 24 + sum(len(b["id"]) for rank in step_through_epochs(after, 24) for b in rank)
    assert handed == 808  # 24 more steps: 23 of 24 rows and a short one of 16
    for dl in after:
        dl.close()
    wait_until(lambda: _ended(api, "resized-end", 7), DEADLINE_S, "every closed")
    progress = _view(api, "resized-end", "progress")
    assert (progress["rows_done"], progress["rows_total"]) == (808, 808), progress
    assert sum(b["rows_total"] for b in progress["ranks"]) == 808
    assert sum(b["rows_done"] for b in progress["ranks"]) == 808


def test_a_rank_killed_after_a_rebuild_reads_crashed(api: str) -> None:
    """Point 10: the rank rebuilt its mixture (its old loader's `closed` at step 4) and was
    SIGKILLed at step 7: on the status and in /metrics it reads crashed (after 20 beats of
    silence), never closed, so a crash alert fires."""
    job = [sys.executable, "-m", "tests.rebuild_kill_job", api, "killed-rebuild"]
    proc = subprocess.run(job, cwd=Path(__file__).parent.parent, timeout=300, check=False)
    assert proc.returncode == -9  # SIGKILL
    status = wait_until(
        lambda: (s := _view(api, "killed-rebuild", "status"))["state"] not in LIVE and s,
        DEADLINE_S, "the rank's silence judged",
    )  # fmt: skip
    assert status["state"] == "crashed", status["headline"]
    metrics = get_bytes(f"{api}/metrics").decode()
    line = (
        'elastic_loader_rank_state{run_id="killed-rebuild",rank="0",process="0",state="crashed"} 1'
    )
    assert line in metrics, [m for m in metrics.splitlines() if "killed-rebuild" in m]
