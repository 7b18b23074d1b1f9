"""Batch-size schedules (issue 27, point 4): `StreamingDataLoader(ds, global_batch_size=G0,
batch_schedule=[(global_step, G), ...])`. Global step t is the same rows on every W, every
row comes once, `loss_scale` is W / G(t) at every step, `len()` counts the ramped epoch, and
a state taken mid-ramp resumes on another W (and worker count) exactly."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loader import (
    MixedDataset,
    StreamingDataLoader,
    StreamingDataset,
    linear_ramp,
    rampup_schedule,
    rows_at_step,
)
from loader.stream import Batching, rank_stream, task_order_indices
from loader.tools.rows import RunPosition


@st.composite
def ramps(draw: st.DrawFn, max_rows: int = 400) -> dict[str, Any]:
    """A plan (N, S), a ramp of G's (multiples of S, rising steps) and two world sizes
    W, W' <= the smallest G."""
    splits = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))  # G / S per phase
    n = draw(st.integers(2 * max(sizes) * splits, max_rows))  # an epoch of two steps or more
    steps = sorted(
        draw(st.sets(st.integers(1, 40), min_size=len(sizes) - 1, max_size=len(sizes) - 1))
    )
    smallest = min(sizes) * splits
    return {
        "n": n,
        "splits": splits,
        "g0": sizes[0] * splits,
        "schedule": [(at, k * splits) for at, k in zip(steps, sizes[1:], strict=True)],
        "worlds": (draw(st.integers(1, smallest)), draw(st.integers(1, smallest))),
    }


def _global_steps(
    job: dict[str, Any], world: int, cursors: tuple[int, ...], first: int
) -> list[list[int]]:
    """The epoch-order indices of every step of a stream, all ranks' rows together."""
    length = job["n"] // job["splits"]
    batching = Batching(None, False, job["g0"], tuple(job["schedule"]))
    streams = [rank_stream(0, cursors, length, r, world, batching, first) for r in range(world)]
    assert len({s.num_batches for s in streams}) == 1  # no rank runs out before the others
    return [
        sorted(i for s in streams for i in task_order_indices(s.task(t), length).tolist())
        for t in range(streams[0].num_batches)
    ]


@settings(max_examples=150, deadline=None)
@given(job=ramps(), start_step=st.integers(0, 12))
def test_each_step_is_the_same_rows_on_every_world_size(
    job: dict[str, Any], start_step: int
) -> None:
    """The pure streams: for any start in the schedule, step t holds G(t) rows (the last
    may hold fewer), the same on W and W', and the epoch's rows come once each."""
    zeros = (0,) * job["splits"]
    one, other = (_global_steps(job, w, zeros, start_step) for w in job["worlds"])
    common = min(len(one), len(other))  # a last step of fewer than W rows is dropped
    assert one[:common] == other[:common] and abs(len(one) - len(other)) <= 1
    batching = Batching(None, False, job["g0"], tuple(job["schedule"]))
    for t, rows in enumerate(one[:-1]):
        assert len(rows) == batching.rows_at(start_step + t, job["worlds"][0])
    flat = [i for rows in one for i in rows]
    assert len(flat) == len(set(flat))
    length = job["n"] // job["splits"]
    assert len(flat) > job["splits"] * length - batching.rows_at(start_step + len(one), 1)


def _loaders(
    table: pa.Table, job: dict[str, Any], world: int, workers: int = 0, drop_last: bool = True
) -> list[Any]:
    """Each rank's loader of the ramp; drop_last=True by default, so that an epoch's last
    short step (kept only where it has a row for every rank) is dropped on every W alike."""
    return [
        StreamingDataLoader(
            StreamingDataset(
                table, ["id"], num_splits=job["splits"], shuffle_seed=3, rank=r, world_size=world
            ),
            num_workers=workers,
            drop_last=drop_last,
            global_batch_size=job["g0"],
            batch_schedule=job["schedule"],
        )
        for r in range(world)
    ]


def _run(
    loaders: list[Any], steps: int
) -> tuple[list[list[int]], list[float], list[int], list[int]]:
    """For each global step: its ids (sorted, all ranks), rank 0's `loss_scale` and `len()`
    after it, and the epoch it belongs to (a new `for` at each epoch's end)."""
    running = [iter(dl) for dl in loaders]
    rows, scales, lengths, epochs = [], [], [], []
    epoch = 0
    for _ in range(steps):
        got = []
        for rank, dl in enumerate(loaders):
            batch = next(running[rank], None)
            if batch is None:
                running[rank] = iter(dl)
                batch = next(running[rank])
                epoch += rank == 0
            got += batch["id"].tolist()
        rows.append(sorted(got))
        scales.append(loaders[0].loss_scale)
        lengths.append(len(loaders[0]))
        epochs.append(epoch)
    return rows, scales, lengths, epochs


@settings(max_examples=10, deadline=None)
@given(job=ramps(max_rows=160), crash=st.integers(0, 30), workers=st.sampled_from([0, 0, 2]))
@example(  # a ramp 12 -> 24 -> 48 on S=4, stopped mid-ramp on 3 ranks, resumed on 4 with workers
    job={"n": 150, "splits": 4, "g0": 12, "schedule": [(3, 24), (5, 48)], "worlds": (3, 4)},
    crash=4,
    workers=2,
)
def test_a_ramp_resumed_mid_way_on_another_world_size(
    job: dict[str, Any], crash: int, workers: int
) -> None:
    """Real loaders over two epochs: uninterrupted on W, and stopped after `crash` steps on
    W then resumed on W' (with `workers`): every step the same rows; each step G(t) rows,
    `loss_scale` W / its rows, `len()` the epoch's steps; every row of an epoch once (but
    those of the dropped last step)."""
    table = pa.table({"id": np.arange(job["n"], dtype=np.int64)})
    world, other = job["worlds"]
    first = _loaders(table, job, world)
    steps = len(first[0]) + 2  # into the second epoch
    rows, scales, lengths, epochs = _run(first, steps)
    batching = Batching(None, False, job["g0"], tuple(job["schedule"]))
    for t in range(steps):
        last = t + 1 == len(epochs) or epochs[t + 1] != epochs[t]
        assert len(rows[t]) == batching.rows_at(t, world)  # drop_last: every step full
        assert scales[t] == world / len(rows[t])
        if epochs[t] == 0 and not last:  # (after an epoch's last, len() is the next one's)
            assert lengths[t] == epochs.count(0)
    zeroth = [i for t in range(steps) if epochs[t] == 0 for i in rows[t]]
    short = job["splits"] * (job["n"] // job["splits"]) - len(zeroth)  # the dropped last step
    assert len(zeroth) == len(set(zeroth)) and 0 <= short < batching.rows_at(epochs.count(0), 1)
    crash = min(crash, steps - 1)
    before = _loaders(table, job, world)
    done = _run(before, crash)[0] if crash else []
    resumed = _loaders(table, job, other, workers)
    for dl in resumed:
        dl.load_state_dict(before[0].state_dict())
    after, after_scales, _, _ = _run(resumed, steps - crash)
    assert done + after == rows
    assert all(s == other / len(r) for s, r in zip(after_scales, after, strict=True))


def test_bad_schedules_name_the_argument() -> None:
    table = pa.table({"id": np.arange(100, dtype=np.int64)})
    ds = StreamingDataset(table, ["id"], num_splits=4, rank=0, world_size=2)
    cases = [
        ({"batch_size": 4, "batch_schedule": [(2, 8)]}, ValueError, "batch_schedule needs global_batch_size"),
        ({"global_batch_size": 8, "batch_schedule": [(2, 10)]}, ValueError, r"batch_schedule\[0\] = \(2, 10\).*multiple of num_splits=4"),
        ({"global_batch_size": 8, "batch_schedule": [(3, 8), (3, 16)]}, ValueError, r"batch_schedule\[1\]'s global_step must be an integer >= 4"),
        ({"global_batch_size": 8, "batch_schedule": [(0, 16)]}, ValueError, r"batch_schedule\[0\]'s global_step must be an integer >= 1"),
        ({"global_batch_size": 8, "batch_schedule": {3: 16}}, TypeError, "batch_schedule must be a list"),
        ({"global_batch_size": 8, "batch_schedule": [16]}, TypeError, r"batch_schedule\[0\] must be a \(global_step, global_batch_size\) pair"),
        ({"global_batch_size": 6, "batch_schedule": [(2, 8)]}, ValueError, "global_batch_size=6 with batch_schedule must be a multiple of num_splits=4"),
    ]  # fmt: skip
    for kwargs, kind, message in cases:
        with pytest.raises(kind, match=message):
            StreamingDataLoader(ds, **kwargs)
    one = StreamingDataset(table, ["id"], num_splits=4, rank=0, world_size=5)
    with pytest.raises(ValueError, match="world_size=5 is more than the global batch G=4"):
        StreamingDataLoader(one, global_batch_size=8, batch_schedule=[(2, 4)])
    alone = StreamingDataset(table, ["id"], num_splits=4)
    with pytest.raises(ValueError, match="batch_schedule with in_order=False"):
        StreamingDataLoader(alone, global_batch_size=8, batch_schedule=[(2, 4)], in_order=False)
    mix = MixedDataset([StreamingDataset(table, ["id"], num_splits=4, rank=0, world_size=3)])
    with pytest.raises(ValueError, match="world_size=3 is more than the global batch G=2"):
        StreamingDataLoader(mix, global_batch_size=8, batch_schedule=[(2, 2)])


def test_the_state_and_len_of_a_ramp() -> None:
    """`global_batch_size` is the next step's G; the state keeps the schedule and that G."""
    table = pa.table({"id": np.arange(200, dtype=np.int64)})
    ds = StreamingDataset(table, ["id"], num_splits=4)
    dl = StreamingDataLoader(ds, global_batch_size=8, batch_schedule=[(3, 16), (6, 32)])
    assert len(dl) == 10 and dl.global_batch_size == 8  # 3 x 8 + 3 x 16 + 4 x 32 = 200
    it = iter(dl)
    sizes = [len(next(it)["id"]) for _ in range(4)]
    assert sizes == [8, 8, 8, 16] and dl.global_batch_size == 16 and len(dl) == 10
    state = dl.state_dict()
    assert state["global_batch_size"] == 16
    assert state["batch_schedule"] == [[0, 8], [3, 16], [6, 32]]


def _megatron_twin(start: int, increment: int, ramp: int, gbs: int) -> list[tuple[int, int]]:
    """Megatron's rule step by step: each step's G from the samples consumed before it."""
    per = Fraction(ramp, (gbs - start) // increment)
    out, consumed, step, rows = [], 0, 0, start
    while rows != gbs:
        consumed, step = consumed + rows, step + 1
        now = gbs if consumed > ramp else start + int(consumed / per) * increment
        if now != rows:
            out.append((step, now))
            rows = now
    return out


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1, 64),
    increment=st.integers(1, 64),
    increments=st.integers(1, 12),
    ramp=st.integers(1, 20_000),
)
def test_rampup_schedule_is_megatrons_rule(
    start: int, increment: int, increments: int, ramp: int
) -> None:
    gbs = start + increment * increments
    assert rampup_schedule(start, increment, ramp, gbs) == _megatron_twin(
        start, increment, ramp, gbs
    )


def test_a_megatron_ramp_through_the_loader() -> None:
    """--rampup-batch-size 8 8 96 --global-batch-size 32 on S=4: G rises 8, 16, 24, 32."""
    schedule = rampup_schedule(8, 8, 96, 32)
    assert schedule == [(4, 16), (6, 24), (8, 32)]  # 32 a stage: at 32, 64, then > 96
    table = pa.table({"id": np.arange(400, dtype=np.int64)})
    dl = StreamingDataLoader(
        StreamingDataset(table, ["id"], num_splits=4), global_batch_size=8, batch_schedule=schedule
    )
    sizes = [len(batch["id"]) for batch in dl]
    assert sizes[:9] == [8] * 4 + [16] * 2 + [24] * 2 + [32] and sum(sizes) == 400


def test_inspect_shows_the_ramp(tmp_path: Any) -> None:
    from loader import checkpoint
    from loader.tools.inspect import format_inspect

    table = pa.table({"id": np.arange(200, dtype=np.int64)})
    dl = StreamingDataLoader(
        StreamingDataset(table, ["id"], num_splits=4), global_batch_size=8, batch_schedule=[(3, 16)]
    )
    it = iter(dl)
    for _ in range(4):
        next(it)
    text = format_inspect(checkpoint.save(dl.state_dict(), tmp_path / "c"))
    assert "  batch ramp  G 8 from step 0, 16 from step 3; G 16 at step 4\n" in text


@st.composite
def mixture_ramps(draw: st.DrawFn) -> dict[str, Any]:
    """Two datasets (sizes, splits, weights), a ramp of any G's (a mixture's step is one
    layout of G rows), W, W' <= the smallest G, a crash point and a worker count."""
    sizes = draw(st.lists(st.integers(2, 9), min_size=1, max_size=3))
    steps = sorted(
        draw(st.sets(st.integers(1, 12), min_size=len(sizes) - 1, max_size=len(sizes) - 1))
    )
    smallest = min(sizes)
    splits = (draw(st.integers(1, 4)), draw(st.integers(1, 3)))  # N a multiple of S below
    return {
        "splits": splits,
        "rows": (splits[0] * draw(st.integers(8, 25)), splits[1] * draw(st.integers(3, 15))),
        "weights": [draw(st.integers(1, 5)), draw(st.integers(0, 5))],
        "g0": sizes[0],
        "schedule": list(zip(steps, sizes[1:], strict=True)),
        "worlds": (draw(st.integers(1, smallest)), draw(st.integers(1, smallest))),
        "crash": draw(st.integers(0, 20)),
        "workers": draw(st.sampled_from([0, 0, 0, 2])),
    }


def _mixture_loaders(job: dict[str, Any], world: int, workers: int = 0) -> list[Any]:
    tables = [
        pa.table({"id": np.arange(n, dtype=np.int64) + k * 1000}) for k, n in enumerate(job["rows"])
    ]
    out = []
    for r in range(world):
        parts = {
            f"d{k}": StreamingDataset(t, ["id"], num_splits=s, rank=r, world_size=world)
            for k, (t, s) in enumerate(zip(tables, job["splits"], strict=True))
        }
        out.append(
            StreamingDataLoader(
                MixedDataset(parts, job["weights"], steps_per_epoch=9),
                num_workers=workers,
                global_batch_size=job["g0"],
                batch_schedule=job["schedule"],
            )
        )
    return out


@settings(max_examples=10, deadline=None)
@given(job=mixture_ramps())
@example(
    job={
        "rows": (60, 20), "splits": (4, 2), "weights": [3, 1], "g0": 4,
        "schedule": [(3, 8), (6, 12)], "worlds": (2, 3), "crash": 5, "workers": 2,
    }
)  # fmt: skip
def test_a_mixtures_ramp_is_elastic(job: dict[str, Any]) -> None:
    """A mixture's batch ramp over two epochs (9 steps each): step t is G(t) rows, the same
    on W and W' after a crash at any step (workers included), `loss_scale` W / G(t), and
    no row of a dataset's pass twice."""
    world, other = job["worlds"]
    rows, scales, lengths, _ = _run(_mixture_loaders(job, world), 18)
    batching = Batching(None, False, job["g0"], tuple(job["schedule"]))
    assert [len(r) for r in rows] == [batching.rows_at(t, world) for t in range(18)]
    assert scales == [world / len(r) for r in rows] and set(lengths) == {9}
    crash = min(job["crash"], 17)
    before = _mixture_loaders(job, world)
    done = _run(before, crash)[0] if crash else []
    resumed = _mixture_loaders(job, other, job["workers"])
    for dl in resumed:
        dl.load_state_dict(before[0].state_dict())
    assert done + _run(resumed, 18 - crash)[0] == rows
    for k, n in enumerate(job["rows"]):  # every pass reads each row once
        counts = Counter(i for r in rows for i in r if k * 1000 <= i < k * 1000 + n)
        assert max(counts.values(), default=0) - min(counts.values(), default=0) <= 1
        assert len(counts) == n or max(counts.values(), default=1) == 1


@pytest.mark.parametrize("ramp", [[(2, 12), (4, 24)], [(1, 6), (30, 60)], [(3, 4)]])
def test_a_mixture_epoch_ended_by_a_pass_counts_its_ramped_steps(
    ramp: list[tuple[int, int]],
) -> None:
    """The default epoch (until the slowest dataset's pass ends) under a ramp: `len()` before
    each epoch, and after every batch, is the number of batches the `for` yields."""
    parts = {
        "a": StreamingDataset(
            pa.table({"id": np.arange(90, dtype=np.int64)}), ["id"], num_splits=3
        ),
        "b": StreamingDataset(
            pa.table({"id": np.arange(40, dtype=np.int64)}), ["id"], num_splits=2
        ),
    }
    dl = StreamingDataLoader(MixedDataset(parts, [2, 1]), global_batch_size=6, batch_schedule=ramp)
    for _ in range(3):  # epochs
        expected = len(dl)
        seen = []
        for _batch in dl:
            seen.append(len(dl))
        assert len(seen) == expected and set(seen[:-1]) <= {expected}


@pytest.mark.parametrize("step", [10**15, 2**63 - 1])
def test_every_step_argument_is_bounded_where_it_is_given(step: int) -> None:
    """Issue 33 item 5: a step no run reaches (10**15 hung len(dl); near int64 the kernels
    overflowed) is refused where it is given, naming the argument and the range."""
    table = pa.table({"id": np.arange(64, dtype=np.int64)})

    def dataset() -> StreamingDataset:
        return StreamingDataset(table, num_splits=4, rank=0, world_size=1)

    mix = MixedDataset({"a": dataset(), "b": dataset()}, [1, 1])
    tries = {
        "batch_schedule[0]'s global_step": lambda: StreamingDataLoader(
            dataset(), global_batch_size=8, batch_schedule=[(step, 16)]
        ),
        "schedule[0] global step": lambda: MixedDataset(
            {"a": dataset(), "b": dataset()}, [1, 1], schedule=[(step, [1, 3])]
        ),
        "at_step": lambda: StreamingDataLoader(mix, global_batch_size=8).set_weights(
            [1, 3], at_step=step
        ),
        "stop": lambda: StreamingDataLoader(dataset(), global_batch_size=8).skip_steps(3, step),
        "start": lambda: StreamingDataLoader(dataset(), global_batch_size=8).skip_steps(step, step),
        "end_step": lambda: linear_ramp(0, step, [1, 1], [1, 3]),
        "step": lambda: rows_at_step(
            RunPosition.from_state(
                StreamingDataLoader(dataset(), global_batch_size=8).state_dict()
            ),
            step,
        ),
    }
    for name, call in tries.items():
        with pytest.raises(ValueError) as err:
            call()
        assert f"{name} must be a global step in [" in str(err.value), (name, str(err.value))
        assert "2**40" in str(err.value)


G8: dict[str, Any] = {"global_batch_size": 8}
RAMP = {"global_batch_size": 8, "batch_schedule": [(3, 16)]}
# From step 4 on the same G as before, and the same rows before step 4 in all: the ledger
# found its cursors consistent and answered steps 1-3 with 12, 4, 8 rows no rank read.
SAME_SUM = {"global_batch_size": 8, "batch_schedule": [(1, 12), (2, 4), (3, 8)]}


@pytest.mark.parametrize(
    "runs",
    [
        [G8, {"global_batch_size": 16}, G8],
        [RAMP, {"global_batch_size": 8, "batch_schedule": [(2, 4), (7, 12)]}, RAMP],
        [G8, SAME_SUM],
    ],
)
def test_the_ledger_answers_past_steps_with_the_schedule_they_ran_with(
    runs: list[dict[str, Any]],
) -> None:
    """Issue 33 item 6: after a resume with another batch size or schedule, rows_at_step
    answered earlier steps by the new one, with rows no rank read (or refused steps it
    could answer); the state keeps the G each past step ran with, across resumes."""
    table = pa.table({"id": np.arange(480, dtype=np.int64)})
    seen: list[list[int]] = []
    state = None
    for kw in runs:  # 5 steps each, then a resume with the next batch sizes
        ds = StreamingDataset(table, num_splits=4, shuffle_seed=5, rank=0, world_size=1)
        dl = StreamingDataLoader(ds, **kw)
        if state is not None:
            dl.load_state_dict(state)
        for batch in dl:
            seen.append(batch["id"].tolist())
            if len(seen) % 5 == 0:
                break
        state = dl.state_dict()
    run = RunPosition.from_state(state)
    # the table's ids are its positions
    assert [rows_at_step(run, t).positions.tolist() for t in range(len(seen))] == seen
