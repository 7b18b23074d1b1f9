"""Exactly-once, elastic determinism and resume at the plan/state level (no I/O).

Ranks are simulated with the same pieces the loader runs: `rank_stream` turns a position
into per-rank batch tasks, `task_order_indices` and the epoch plan turn a task into row
positions. Thousands of generated jobs run in seconds; tests/test_loader_properties.py
runs the same properties through real tables.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.plan import EpochPlan, PlanSpec
from loader.stream import (
    Batching,
    RankStream,
    SplitStream,
    StepStream,
    rank_stream,
    task_order_indices,
)
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
    spec: PlanSpec, epoch: int, cursors: tuple[int, ...], world: int, batching: Batching
) -> list[RankStream]:
    return [
        rank_stream(epoch, cursors, spec.rows_per_split, r, world, batching) for r in range(world)
    ]


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    job = draw(resize_jobs([1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 48]))
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
    batching = Batching(job["batch"], job["drop_last"], job["global_batch"])
    before = streams(spec, epoch, start, job["world"], batching)
    assert len({s.num_batches for s in before}) == 1, "every rank yields the same number of batches"
    cut = int(job["cut"] * before[0].num_batches)
    read = [row for s in before for batch in rank_batches(plan, s, 0, cut) for row in batch]
    # every rank writes the same global state without talking to the others
    states = {tuple(s.cursors_after(cut)) for s in before}
    assert len(states) == 1
    (cursors,) = states
    new = Batching(job["new_batch"], job["drop_last"], job["new_global_batch"])
    after = streams(spec, epoch, cursors, job["new_world"], new)
    assert len({s.num_batches for s in after}) == 1, "the same number of steps on every rank"
    assert len({s.skipped for s in after}) == 1
    read += [row for s in after for batch in rank_batches(plan, s) for row in batch]
    assert len(read) == len(set(read)), "no row twice"
    epoch_rows = set(np.concatenate([plan.split_rows(s) for s in range(spec.num_splits)]).tolist())
    assert set(read) <= epoch_rows
    assert len(read) == len(epoch_rows) - after[0].skipped, (
        "every row once, but those reported skipped"
    )
    left = len(epoch_rows) - sum(cursors)
    if isinstance(after[0], StepStream) and not job["drop_last"]:
        # the step layout never skips to balance ranks: only a last step too short to give
        # every rank a row
        tail = left % new.global_rows(job["new_world"])
        assert after[0].skipped == (tail if tail < job["new_world"] else 0)
    elif not job["drop_last"]:
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
    splits = draw(st.sampled_from([1, 2, 3, 4, 6, 7, 8, 12, 16, 24]))
    global_batch = splits * draw(st.integers(1, 6))
    worlds = st.integers(1, min(global_batch, 40))  # any W <= G: divisors of S or not
    return {
        "spec": PlanSpec(
            draw(st.integers(splits, 500)),
            splits,
            True,
            draw(st.integers(0, 999)),
            draw(st.integers(1, 9)),
        ),
        "global_batch": global_batch,
        "new_global_batch": splits * draw(st.integers(1, 6)),
        "worlds": draw(st.lists(worlds, min_size=2, max_size=3)),
        "cut": draw(st.floats(0, 1)),
    }


def global_batches(
    plan: EpochPlan, cursors: tuple[int, ...], world: int, global_batch: int
) -> list[list[int]]:
    batching = Batching(None, False, global_batch)
    ranks = [
        rank_batches(plan, s) for s in streams(plan.spec, plan.epoch, cursors, world, batching)
    ]
    return [sorted(row for batches in ranks for row in batches[t]) for t in range(len(ranks[0]))]


def split_slices(plan: EpochPlan, per_split: int, start: int = 0) -> list[list[int]]:
    """By the contract: global step t is rows [t*G/S, (t+1)*G/S) of every split."""
    length = plan.spec.rows_per_split
    return [
        sorted(
            row
            for s in range(plan.spec.num_splits)
            for row in plan.split_rows(s, a, min(a + per_split, length)).tolist()
        )
        for a in range(start, length, per_split)
    ]


@settings(max_examples=500, deadline=None)
@given(job=elastic_jobs())
def test_global_batches_are_the_same_on_every_world_size(job: dict) -> None:
    spec, g = job["spec"], job["global_batch"]
    plan = spec.epoch(1)
    per_split = g // spec.num_splits
    expected = split_slices(plan, per_split)
    tail = spec.num_splits * (spec.rows_per_split % per_split)
    start = (0,) * spec.num_splits
    for world in job["worlds"]:
        want = expected if not 0 < tail < world else expected[:-1]  # a tail too short: dropped
        assert global_batches(plan, start, world, g) == want
    # resume at a step boundary on another world size, with another G' (a multiple of S):
    # from there on step t' is rows of G'/S of every split from the saved cursors
    first, second = job["worlds"][:2]
    stream = rank_stream(1, start, spec.rows_per_split, 0, first, Batching(None, False, g))
    cut = min(int(job["cut"] * stream.num_batches), spec.rows_per_split // per_split)
    cursors = tuple(stream.cursors_after(cut))
    assert set(cursors) == {cut * per_split}
    new_g = max(job["new_global_batch"], spec.num_splits * -(-second // spec.num_splits))
    want = split_slices(plan, new_g // spec.num_splits, cut * per_split)
    new_tail = spec.num_splits * (
        (spec.rows_per_split - cut * per_split) % (new_g // spec.num_splits)
    )
    if 0 < new_tail < second:
        want = want[:-1]
    assert global_batches(plan, cursors, second, new_g) == want


def test_with_w_dividing_s_the_step_layout_is_todays_split_layout() -> None:
    """Upgrading mid-run changes no row: where W divides S and G is a multiple of S, each
    rank's batches are the split layout's, same rows in the same order."""
    spec = PlanSpec(1000, 12, True, 5, 3)
    plan = spec.epoch(0)
    for world in (1, 2, 3, 4, 6, 12):
        for global_batch in (12, 24, 96, 120):
            for cursors in ((0,) * 12, (40,) * 12, (83,) * 12):
                b = global_batch // world
                for rank in range(world):
                    old = SplitStream(0, cursors, spec.rows_per_split, rank, world, b, False)
                    new = StepStream(
                        0, cursors, spec.rows_per_split, rank, world, global_batch, False
                    )
                    assert rank_batches(plan, new) == rank_batches(plan, old)
                    assert new.cursors_after(2) == old.cursors_after(2)


def test_grains_failing_case_8_ranks_then_7() -> None:
    """16 splits, 8 ranks for 5 steps, then 7 ranks: every rank the same number of steps,
    1,600 of 1,600 rows once (Grain's newest iterator gives 30, 30, 20, ... batches here)."""
    spec = PlanSpec(1600, 16, True, 3, 1)
    plan = spec.epoch(0)
    eight = streams(spec, 0, (0,) * 16, 8, Batching(16, False))  # G = 128
    read = [row for s in eight for b in rank_batches(plan, s, 0, 5) for row in b]
    cursors = tuple(eight[0].cursors_after(5))
    for batching in (Batching(None, False, 128), Batching(16, False)):  # keep G, or keep b
        seven = streams(spec, 0, cursors, 7, batching)
        steps = [s.num_batches for s in seven]
        assert len(set(steps)) == 1, steps
        rest = [row for s in seven for b in rank_batches(plan, s) for row in b]
        assert sorted(read + rest) == list(range(1600))
        assert seven[0].skipped == 0


def test_unequal_slices_differ_by_at_most_one_row_and_cover_the_step() -> None:
    spec = PlanSpec(2560, 8, True, 1, 4)
    for world in (3, 5, 7, 9, 100, 256):
        ss = streams(spec, 0, (0,) * 8, world, Batching(None, False, 256))
        sizes = [s.task_rows(0) for s in ss]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 256
        assert {s.global_rows(0) for s in ss} == {256}
