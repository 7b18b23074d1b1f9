"""The features at their joints: a seeded sample of the product {rows, packed} x {one dataset,
a mixture of 2-3 with fixed weights, a weight schedule or a set_weights call} x {fixed G, a
batch ramp} x {skip_steps or not} x W, W' in 1..4 (G not always a multiple of W) x {0, 2
workers, before and after the resume} x {shuffle clumps of 1 or 3} x {telemetry to a real
collector}, each run on W ranks in one process, stopped at a random step, resumed on W' from
its JSON state (the skipped range registered again or not); tests/joints.py makes the jobs.
For every job:

- the run with its skipped range is the run without it, less exactly the skipped steps;
- every row of an epoch comes once (one dataset: all but less than the dropped last step;
  packed: every token once); in a mixture each dataset's rows (blocks), pass after pass,
  are that dataset's epochs read alone;
- global step t is the same rows on W, on W' after the resume, and on one rank without
  workers (so: the same for 0 and 2 workers), and the resumed run is the one never stopped;
- the ledger of the state saved on W and of the state loaded on W' names exactly the rows
  (blocks: documents and token ranges) the ranks handed out at each step, with their ranks,
  and the skipped steps (jumped or pending) as skipped;
- with telemetry, every event the ranks send is accepted (no 422, nothing dropped) and stored.

A batch ramp over a mixture is left out of the product (its properties are
tests/test_batch_schedule.py's); a set_weights at_step that a skip jumped past is refused by
design and asserted as such. With workers a set_weights call comes before reading (a step
read ahead is refused by design, docs/mixtures.md)."""

from __future__ import annotations

import json
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from loader import MixedDataset, StreamingDataLoader, StreamingDataset, rows_at_step
from loader.telemetry.client import TelemetryWarning
from loader.tools.rows import RunPosition
from tests import joints
from tests.collector_api import collector_process
from tests.joints import BASE, EOS, Job, Steps, drive, loaders, merged, units
from tests.net import get_json, http_ok, wait_until

FAST = joints.sample_jobs(seed=2026, count=64)
SLOW = joints.sample_jobs(seed=7, count=20, workers=2, telemetry=True)  # every cell


def _length(job: Job, tabs: list[pa.Table]) -> int:
    """Global steps to read: the first epoch and 3 steps into the next (40 at most)."""
    return min(len(loaders(job, tabs, 1, skip=False)[0]) + 3, 40)


def _skipped(job: Job) -> set[int]:
    return set(range(*job.skip)) if job.skip else set()


def _check_once(job: Job, tabs: list[pa.Table], steps: Steps) -> None:
    """Every row (block) of a mixture's dataset's pass once: the mixture's units of dataset
    k, pass after pass, are that dataset's epochs read alone (its own plan, epoch by epoch:
    a new shuffle each) in the run without skips. (One dataset: by epoch,
    `_check_epochs_of_one_dataset`.)"""
    if not job.mixture:
        return
    order = [u for t in sorted(steps) for b in steps[t] for u in _labelled(b)]
    for k in range(len(job.sources)):
        mine = [u for src, u in order if src == k]
        alone = StreamingDataLoader(
            joints.part(job, tabs[k], k),
            global_batch_size=job.sources[k][1],
            drop_last=True,
        )
        done, epoch = 0, 0
        while done < len(mine):
            assert epoch < 50, f"dataset {k}: {len(mine) - done} units past 50 passes"
            passed = [u for b in alone for u in units(b)]
            chunk = mine[done : done + len(passed)]
            assert Counter(chunk) <= Counter(passed), f"dataset {k}, pass {epoch}"
            if len(chunk) == len(passed):
                assert sorted(chunk) == sorted(passed), f"dataset {k}, pass {epoch}"
            done, epoch = done + len(passed), epoch + 1


def _labelled(batch: dict[str, Any]) -> list[tuple[int, Any]]:
    """(dataset index, unit) of each row or block of a batch, in order."""
    found = units(batch)
    sources = batch["source"].tolist() if "source" in batch else [0] * len(found)
    return list(zip(sources, found, strict=True))


def _check_epochs_of_one_dataset(job: Job, steps: Steps, ledger: Any) -> None:
    """One dataset: an epoch's rows are all the table's rows but less than a step's (the
    dropped short last step); epochs told by the ledger's answer for each step."""
    size, splits = job.sources[0]
    per_epoch: dict[int, list[Any]] = {}
    for t in sorted(steps):
        epoch = rows_at_step(ledger, t).epoch
        per_epoch.setdefault(epoch, []).extend(u for b in steps[t] for u in units(b))
    biggest = max([job.g] + [g for _, g in job.ramp])
    for epoch, got in per_epoch.items():
        if job.kind == "rows":
            assert len(set(got)) == len(got), f"epoch {epoch}: a row twice"
            if epoch < max(per_epoch):  # a whole epoch: all but the dropped short step
                assert 0 <= splits * (size // splits) - len(got) < biggest
        else:
            tokens = [tok for block in got for tok in block if tok != EOS]
            assert len(set(tokens)) == len(tokens), f"epoch {epoch}: a token twice"


def _check_ledger(
    job: Job, tabs: list[pa.Table], state: dict[str, Any], steps: Steps, epochs: dict[int, int]
) -> None:
    """The ledger of `state` names each step's rows exactly as the ranks of `steps` (the run
    on the state's W) handed them out, and the skipped steps as skipped. One dataset's state
    answers the steps of its own epoch and later (README: earlier epochs need their own
    checkpoint); a mixture's every step."""
    source: Any = None  # in-memory tables: the ledger reopens what a state names
    if job.kind == "packed":
        source = dict(zip(state["names"], tabs, strict=True)) if job.mixture else tabs[0]
    run = RunPosition.from_state(state, source=source)
    texts = None if job.kind == "rows" else [t.column("tokens").to_pylist() for t in tabs]
    for t, got in steps.items():
        if not job.mixture and epochs[t] < state["epoch"]:
            continue
        found = rows_at_step(run, t)
        ranks = [r for r, b in enumerate(got) for _ in units(b)]
        assert not found.skipped and found.ranks.tolist() == ranks, t
        if texts is not None:  # packed: each block is its documents' token ranges
            assert found.documents is not None
            blocks = [u for b in got for u in units(b)]
            of = found.datasets.tolist() if found.datasets is not None else [0] * len(blocks)
            for block, pieces, k in zip(blocks, found.documents, of, strict=True):
                text = texts[k]
                assert [tok for p, a, z in pieces for tok in (text[p] + [EOS])[a:z]] == list(
                    block
                ), t
            continue
        ids = [i for b in got for i in b["id"].tolist()]
        datasets = found.datasets.tolist() if found.datasets is not None else [0] * len(ids)
        assert [
            p + k * BASE for p, k in zip(found.positions.tolist(), datasets, strict=True)
        ] == ids, t
        if job.mixture:
            assert datasets == [k for b in got for k in b["source"].tolist()], t
    for t in _skipped(job):  # jumped already or pending in the state: skipped, no rows
        try:
            found = rows_at_step(run, t)
        except ValueError as err:  # one dataset: an earlier epoch needs its own checkpoint
            assert not job.mixture and t < state["global_step"], err
            assert "ask a checkpoint of that epoch" in str(err)
            continue
        assert found.skipped and len(found.ranks) == 0, f"step {t} not skipped in the ledger"


def _json(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


def check_job(
    job: Job,
    telemetry: str | None = None,
    ran: list[StreamingDataLoader] | None = None,
    run_id: str | None = None,
) -> None:
    """Every property of the module docstring for `job`; `ran` gets the loaders that report
    to `telemetry` (as `run_id`) as they are built, so that they are closed whatever happens."""
    ran = [] if ran is None else ran
    tabs = joints.tables(job)
    until = _length(job, tabs)
    ref = drive(job, loaders(job, tabs, 1), until, [False])
    until = max(ref) + 1  # past `until` where a skipped range crosses it
    alike = replace(job, call=None) if job.call_refused else job  # no skip: no refusal
    plain = drive(alike, loaders(alike, tabs, 1, skip=False), until, [False])
    _check_once(job, tabs, plain)
    assert set(ref) == set(range(until)) - _skipped(job)  # exactly the steps asked, skipped
    assert merged(ref) == {t: rows for t, rows in merged(plain).items() if t in ref}
    crash = min(job.crash, until - 1)
    called = [False]
    first = loaders(job, tabs, job.world, workers=job.workers, telemetry=telemetry, run_id=run_id)
    ran += first
    epochs: dict[int, int] = {}
    before = drive(job, first, crash, called, epochs)
    state = _json(first[0].state_dict())
    assert all(_json(dl.state_dict()) == state for dl in first)
    second = loaders(
        job, tabs, job.world2, workers=job.workers2, resumed=True, telemetry=telemetry,
        run_id=run_id,
    )  # fmt: skip
    ran += second
    for dl in second:
        dl.load_state_dict(state)
        if job.again:  # registered again after the load (a config read at every start)
            dl.skip_steps(*job.skip)  # type: ignore[misc]
    loaded = _json(second[0].state_dict())
    after = drive(job, second, until, called, epochs)
    assert merged(before) | merged(after) == merged(ref)  # as if never stopped, on any W
    if not job.mixture:  # epochs told by the ledger of the run's start
        start = _json(loaders(job, tabs, 1, skip=False)[0].state_dict())
        source = None if job.kind == "rows" else tabs[0]
        _check_epochs_of_one_dataset(job, plain, RunPosition.from_state(start, source=source))
    _check_ledger(job, tabs, state, before, epochs)
    if job.call:  # a phase set after the resume: the state taken at the end knows it
        loaded = _json(second[0].state_dict())
    _check_ledger(job, tabs, loaded, after, epochs)


@pytest.mark.parametrize("job", FAST, ids=Job.name)
def test_a_generated_joint(job: Job) -> None:
    check_job(job)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The collector as a deployment runs it: its own process, so this process's training
    loops (several ranks here at once) never hold up its answers; its URL."""
    with collector_process(tmp_path_factory.mktemp("joints") / "c.db") as (_, url):
        wait_until(lambda: http_ok(url + "/health"), 60, "the collector's /health")
        yield url


@pytest.mark.slow
@pytest.mark.usefixtures("patient_telemetry")  # what is checked is refusals, not load
@pytest.mark.parametrize("job", SLOW, ids=Job.name)
def test_a_generated_joint_with_workers_and_telemetry(job: Job, collector: str) -> None:
    """Every event the ranks send is accepted and stored once."""
    run_id = f"joint-{uuid.uuid4().hex}"  # its own run: its events counted apart
    ran: list[StreamingDataLoader] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", TelemetryWarning)  # a refusal (422) warns: fail on it
        try:
            check_job(job, collector, ran, run_id)
        finally:  # flushed and stopped: no loader of a failed job reports into the next
            for dl in ran:
                dl.close()
    clients = [dl._telemetry.client for dl in ran]  # type: ignore[attr-defined]
    refused = {c.static["rank"]: c.dropped for c in clients if c.dropped}
    assert not refused, f"events refused or dropped per rank: {refused}"
    sent = sum(c.sent for c in clients)
    wait_until(
        lambda: get_json(f"{collector}/api/runs/{run_id}")["events"] == sent,
        30,
        f"the {sent} events of {job.name()} stored",
    )


def test_a_batch_ramp_over_a_mixture_follows_its_schedule() -> None:
    """The cell the product leaves out (a ramp over a mixture; its properties are
    tests/test_batch_schedule.py's `test_a_mixtures_ramp_is_elastic`): G changes at its step."""
    parts = [StreamingDataset(joints.rows_table(k, 20), num_splits=2) for k in range(2)]
    dl = StreamingDataLoader(
        MixedDataset(parts, [1, 1]), global_batch_size=4, batch_schedule=[(2, 8)]
    )
    sizes = [len(batch["id"]) for batch, _ in zip(dl, range(4), strict=False)]
    assert sizes == [4, 4, 8, 8]


def test_the_sample_covers_the_product() -> None:
    """Every cell of {rows, packed} x {one dataset, mixture, schedule, set_weights} x {skip or
    not} (and the ramp for one dataset), W and W' from 1 to 4, G not a multiple of W."""
    for jobs in (FAST, SLOW):
        cells = Counter(
            (j.kind, j.mixture, bool(j.schedule), bool(j.call), bool(j.ramp), bool(j.skip))
            for j in jobs
        )
        assert len(cells) == 2 * (2 * 2 + 3 * 2)
    assert {j.world for j in FAST} == {j.world2 for j in FAST} == {1, 2, 3, 4}
    assert any(j.g % j.world for j in FAST) and any(j.g % j.world2 for j in FAST)
    assert {j.workers for j in SLOW} == {2} and {j.workers2 for j in SLOW} == {0, 2}
    assert all(j.telemetry for j in SLOW) and {j.clump for j in FAST} == {1, 3}
    assert any(j.again for j in FAST)
