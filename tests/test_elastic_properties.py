"""Exactly-once, elastic determinism and resume at the plan/state level (no I/O).

Ranks are simulated with the same pieces the loader runs: `RankStream` turns a position
into per-rank batch tasks, `task_order_indices` and the epoch plan turn a task into row
positions. Thousands of generated jobs run in seconds; tests/test_loader_properties.py
runs the same properties through real tables.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.plan import EpochPlan, PlanSpec, supported_world_sizes
from loader.stream import RankStream, task_order_indices
from tests.strategies import resize_jobs


def rank_batches(
    plan: EpochPlan, stream: RankStream, first: int = 0, stop: int | None = None
) -> list[list[int]]:
    stop = stream.num_batches if stop is None else stop
    length = plan.spec.rows_per_split
    return [
        plan.order(task_order_indices(stream.task(t), length)).tolist() for t in range(first, stop)
    ]


def streams(
    spec: PlanSpec, epoch: int, cursors: tuple[int, ...], world: int, batch: int, drop_last: bool
) -> list[RankStream]:
    return [
        RankStream(epoch, cursors, spec.rows_per_split, r, world, batch, drop_last)
        for r in range(world)
    ]


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    job = draw(resize_jobs([1, 2, 3, 4, 6, 8, 12, 16, 24, 48]))
    spec = PlanSpec(
        job["rows"],
        job["num_splits"],
        job["shuffle"],
        job["shuffle_seed"],
        job["shuffle_clump_size"],
    )
    return {**job, "spec": spec}


@settings(max_examples=2000, deadline=None)
@given(job=jobs())
def test_crash_anywhere_resume_on_any_world_size(job: dict) -> None:
    spec, epoch = job["spec"], job["epoch"]
    plan = spec.epoch(epoch)
    start = (0,) * spec.num_splits
    before = streams(spec, epoch, start, job["world"], job["batch"], job["drop_last"])
    counts = {s.num_batches for s in before}
    assert len(counts) == 1, "every rank yields the same number of batches"
    cut = int(job["cut"] * before[0].num_batches)
    read = [row for s in before for batch in rank_batches(plan, s, 0, cut) for row in batch]
    # every rank writes the same global state without talking to the others
    states = {tuple(s.cursors_at(cut * s.batch_size)) for s in before}
    assert len(states) == 1
    (cursors,) = states
    after = streams(spec, epoch, cursors, job["new_world"], job["new_batch"], job["drop_last"])
    assert len({s.num_batches for s in after}) == 1
    read += [row for s in after for batch in rank_batches(plan, s) for row in batch]
    assert len(read) == len(set(read)), "no row twice"
    epoch_rows = set(np.concatenate([plan.split_rows(s) for s in range(spec.num_splits)]).tolist())
    assert set(read) <= epoch_rows
    assert len(read) == len(epoch_rows) - after[0].skipped, (
        "every row once, but those reported skipped"
    )
    if not job["drop_last"]:
        balanced = (
            len(
                {
                    sum(spec.rows_per_split - c for c in cursors[s.splits.start : s.splits.stop])
                    for s in after
                }
            )
            == 1
        )
        assert (after[0].skipped == 0) == balanced


@st.composite
def elastic_jobs(draw: st.DrawFn) -> dict:
    splits = draw(st.sampled_from([1, 2, 4, 6, 8, 12, 24]))
    sizes = supported_world_sizes(splits)
    global_batch = splits * draw(st.integers(1, 6))
    worlds = [w for w in sizes if global_batch % w == 0]
    return {
        "spec": PlanSpec(
            draw(st.integers(splits, 500)),
            splits,
            True,
            draw(st.integers(0, 999)),
            draw(st.integers(1, 9)),
        ),
        "global_batch": global_batch,
        "worlds": draw(st.lists(st.sampled_from(worlds), min_size=2, max_size=3)),
        "cut": draw(st.floats(0, 1)),
    }


def global_batches(
    plan: EpochPlan, cursors: tuple[int, ...], world: int, global_batch: int
) -> list[list[int]]:
    ranks = [
        rank_batches(plan, s)
        for s in streams(plan.spec, plan.epoch, cursors, world, global_batch // world, False)
    ]
    return [sorted(row for batches in ranks for row in batches[t]) for t in range(len(ranks[0]))]


@settings(max_examples=500, deadline=None)
@given(job=elastic_jobs())
def test_global_batches_are_the_same_on_every_world_size(job: dict) -> None:
    spec, g = job["spec"], job["global_batch"]
    plan = spec.epoch(1)
    per_split = g // spec.num_splits
    expected = [
        sorted(
            row
            for s in range(spec.num_splits)
            for row in plan.split_rows(
                s, t * per_split, min((t + 1) * per_split, spec.rows_per_split)
            ).tolist()
        )
        for t in range(-(-spec.rows_per_split // per_split))
    ]
    start = (0,) * spec.num_splits
    for world in job["worlds"]:
        assert global_batches(plan, start, world, g) == expected
    # resume at a step boundary on another world size: the rest is the same global batches
    first, second = job["worlds"][:2]
    stream = RankStream(1, start, spec.rows_per_split, 0, first, g // first, False)
    cut = int(job["cut"] * stream.num_batches)
    cursors = tuple(stream.cursors_at(cut * stream.batch_size))
    assert global_batches(plan, cursors, second, g) == expected[cut:]
