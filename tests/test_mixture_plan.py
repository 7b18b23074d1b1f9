"""Mixtures at the plan level (no I/O): exact counts, the same global steps on every W,
each row once per pass, and resumes on another W with new weights.

Ranks are simulated with what the loader runs: `MixStream.tasks` per rank, each task's
per-dataset `BatchTask`s turned into order indices, batches joined in layout order.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.kernels.mix import _mix_counts, _mix_labels
from loader.layout import slice_bounds
from loader.mixture.plan import (
    ALL_PASSES,
    FIRST_PASS,
    MixPlan,
    MixPosition,
    SourceAt,
    Weights,
    pass_of,
)
from loader.mixture.stream import MixStream
from loader.stream import task_order_indices
from loader.world import World
from tests import reference

Row = tuple[int, int, int]  # (dataset, pass, order index in that pass)


def make_plan(
    sizes: list[tuple[int, int]], weights: list[int], rule: str | int, seed: int | None
) -> MixPlan:
    """Sources of fixed pass lengths: many passes inside a step are one segment."""
    lengths = [length for _, length in sizes]
    return MixPlan(
        Weights.of(weights, len(sizes)),
        tuple(s for s, _ in sizes),
        lambda k, e: lengths[k],
        seed,
        rule,
        (True,) * len(sizes),
    )


def rank_steps(
    plan: MixPlan, pos: MixPosition, rank: int, world: int, g: int, steps: int
) -> list[list[Row]]:
    """What one rank's loader would read: `steps` batches from `pos` (across epochs)."""
    out: list[list[Row]] = []
    while len(out) < steps:
        stream = MixStream(plan, pos, World(rank, world), g)
        for task in stream.tasks(3):
            out.extend(placed(plan, task))
        for _ in range(stream.num_batches):
            pos, _ = plan.step(pos, g)
        if stream.num_batches == 0:  # an epoch already over (new weights): the next one
            passes = tuple(s.epoch for s in pos.sources)
            pos = replace(pos, epoch=pos.epoch + 1, step=0, epoch_passes=passes)
    return out[:steps]


def placed(plan: MixPlan, task) -> list[list[Row]]:
    """A task's batches as the reader lays them out: each group's rows at `places()`."""
    rows: list[Row | None] = [None] * sum(task.sizes)
    for g, ((k, t), at) in enumerate(zip(task.groups, task.places(), strict=True)):
        one = [row for piece in _rows(plan, k, t) for row in piece]
        group = [(k, e + p, o) for p in range(task.passes_of(g)) for k, e, o in one]
        assert len(group) == len(at)
        for row, p in zip(group, at.tolist(), strict=True):
            rows[p] = row
    assert all(
        r is not None and r[0] == lab for r, lab in zip(rows, task.labels.tolist(), strict=True)
    )
    bounds = np.cumsum((0, *task.sizes)).tolist()
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]  # type: ignore[misc]


def _rows(plan: MixPlan, k: int, task) -> list[list[Row]]:
    length = plan.units(k, task.epoch)
    order = task_order_indices(task, length).tolist()
    bounds = np.cumsum((0, *task.sizes)).tolist()
    return [[(k, task.epoch, o) for o in order[a:b]] for a, b in itertools.pairwise(bounds)]


def global_steps(
    plan: MixPlan, pos: MixPosition, world: int, g: int, steps: int
) -> list[list[Row]]:
    """The union over ranks of each step (a set: inside a rank, rows come in stream order)."""
    per_rank = [rank_steps(plan, pos, r, world, g, steps) for r in range(world)]
    return [sorted(row for r in range(world) for row in per_rank[r][t]) for t in range(steps)]


def after(plan: MixPlan, pos: MixPosition, g: int, steps: int) -> MixPosition:
    for _ in range(steps):
        pos, _ = plan.step(pos, g)
    return pos


sizes_st = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 9)), min_size=1, max_size=4)


@st.composite
def mixtures(draw):
    sizes = draw(sizes_st)
    weights = draw(st.lists(st.integers(0, 9), min_size=len(sizes), max_size=len(sizes)))
    if sum(weights) == 0:
        weights[0] = 1
    g = draw(st.integers(1, 24))
    world = draw(st.integers(1, g))
    rule = draw(st.sampled_from([FIRST_PASS, ALL_PASSES, pass_of(0), 1, 4]))
    if rule == pass_of(0) and weights[0] == 0:
        weights[0] = 1
    seed = draw(st.sampled_from([None, 0, 7]))
    return sizes, weights, g, world, rule, seed


def check_passes(rows: list[Row], sizes: list[tuple[int, int]]) -> None:
    """No row twice in a pass, and a pass is complete before the next one starts."""
    seen: dict[tuple[int, int], set[int]] = {}
    for k, epoch, order in rows:
        assert order not in seen.setdefault((k, epoch), set()), "a row twice in one pass"
        seen[(k, epoch)].add(order)
        if epoch > 0:
            s, length = sizes[k]
            assert len(seen.get((k, epoch - 1), ())) == s * length, "a pass left unfinished"


@settings(max_examples=150)
@given(mixtures(), st.integers(1, 12))
def test_counts_exact_and_steps_the_same_on_every_world_size(mix, steps: int) -> None:
    sizes, weights, g, world, rule, seed = mix
    plan = make_plan(sizes, weights, rule, seed)
    start = MixPosition.start([SourceAt(0, (0,) * s) for s, _ in sizes])
    one = global_steps(plan, start, 1, g, steps)
    assert global_steps(plan, start, world, g, steps) == one
    total = sum(weights)
    counts = [0] * len(sizes)
    for t, step in enumerate(one, 1):
        assert len(step) == g
        for k, _, _ in step:
            counts[k] += 1
        for k, w in enumerate(weights):
            assert abs(counts[k] - Fraction(t * g * w, total)) < 1
    check_passes([row for step in one for row in step], sizes)
    for r in range(world):  # every rank the same number of rows a step as a single dataset
        lo, hi = slice_bounds(r, world, g)
        batches = rank_steps(plan, start, r, world, g, steps)
        assert all(len(b) == hi - lo for b in batches)
        for batch in batches:  # ... and of each dataset, fewer than 2 rows from its share
            for k, w in enumerate(weights):
                held = sum(1 for row in batch if row[0] == k)
                assert abs(held - Fraction((hi - lo) * w, total)) < 2


@settings(max_examples=150)
@given(mixtures(), st.integers(0, 10), st.integers(1, 24), st.data())
def test_resume_on_another_world_size_with_new_weights(mix, crash: int, g2: int, data) -> None:
    sizes, weights, g, world, rule, seed = mix
    world2 = data.draw(st.integers(1, g2))
    new = data.draw(st.lists(st.integers(0, 9), min_size=len(sizes), max_size=len(sizes)))
    if sum(new) == 0 or (rule == pass_of(0) and new[0] == 0):  # as MixedDataset requires
        new[0] = 1
    plan = make_plan(sizes, weights, rule, seed)
    start = MixPosition.start([SourceAt(0, (0,) * s) for s, _ in sizes])
    before = global_steps(plan, start, world, g, crash)
    saved = after(plan, start, g, crash)
    # the resume: same datasets and passes, new weights from the resumed step (a new phase)
    plan2 = make_plan(sizes, new, rule, seed)
    if Weights.of(new, len(new)) != plan.weights_at(0):
        saved = MixPosition(
            saved.epoch,
            saved.step,
            saved.global_step,
            saved.global_step,
            (0,) * len(sizes),
            saved.sources,
            saved.epoch_passes,
            saved.supplied,
        )
    resumed = global_steps(plan2, saved, world2, g2, 6)
    assert resumed == global_steps(plan2, saved, 1, g2, 6)
    check_passes([row for step in before + resumed for row in step], sizes)
    counts = [0] * len(sizes)
    for t, step in enumerate(resumed, 1):
        for k, _, _ in step:
            counts[k] += 1
        for k, w in enumerate(new):
            if Weights.of(new, len(new)) != plan.weights_at(0):
                assert abs(counts[k] - Fraction(t * g2 * w, sum(new))) < 1


@settings(max_examples=60)
@given(mixtures())
def test_epoch_ends_where_the_rule_says(mix) -> None:
    sizes, weights, g, _, rule, seed = mix
    plan = make_plan(sizes, weights, rule, seed)
    pos = MixPosition.start([SourceAt(0, (0,) * s) for s, _ in sizes])
    steps = plan.steps_left(pos, g)
    walked = after(plan, pos, g, steps)
    assert walked.epoch == 1 and walked.step == 0
    if steps > 1:
        assert after(plan, pos, g, steps - 1).epoch == 0
    active = [k for k, w in enumerate(weights) if w]
    done = [walked.sources[k].epoch > 0 for k in active]
    if rule == pass_of(0):
        assert walked.sources[0].epoch >= 1
    elif rule == FIRST_PASS:
        assert any(done)
    elif rule == ALL_PASSES:
        assert all(done)
    else:
        assert steps == rule


row_steps = st.lists(st.integers(0, 40), min_size=1, max_size=6)
kernel_weights = st.lists(st.integers(0, 30), min_size=1, max_size=5)


@settings(max_examples=200)
@given(kernel_weights, row_steps)
def test_count_kernel_matches_twin(weights: list[int], steps: list[int]) -> None:
    for counts, rows, w in _walk(weights, steps):
        want = reference.mix_counts(list(w.shares), counts, rows)
        assert (
            _mix_counts(w._array, w.period, np.asarray(counts, dtype=np.int64), rows).tolist()
            == want
        )
        assert all(b >= a for a, b in zip(counts, want, strict=True))


@settings(max_examples=200)
@given(kernel_weights, row_steps)
def test_label_kernel_matches_twin(weights: list[int], steps: list[int]) -> None:
    for counts, rows, w in _walk(weights, steps):
        want = reference.mix_labels(list(w.shares), counts, rows)
        assert (
            _mix_labels(w._array, w.period, np.asarray(counts, dtype=np.int64), rows).tolist()
            == want
        )


def _walk(weights: list[int], steps: list[int]):
    """(counts so far, rows, weights) for each of `steps` rows of the twin's sequence."""
    if sum(weights) == 0:
        weights[0] = 1
    w = Weights.of(weights, len(weights))
    counts = [0] * len(weights)
    for rows in steps:
        yield counts, rows, w
        counts = reference.mix_counts(list(w.shares), counts, rows)


def test_weights_are_exact_fractions() -> None:
    assert Weights.of([0.7, 0.2, 0.1], 3).shares == (7, 2, 1)
    assert Weights.of([1 / 3, 2 / 3], 2).shares == (1, 2)
    assert Weights.of([Fraction(1, 6), 1], 2).shares == (1, 6)
    for bad, match in (
        ([1, -1], "weights\\[1\\]"),
        ([0, 0], "all 0"),
        ([1], "one each"),
        (["a", 1], "number"),
    ):
        with pytest.raises((ValueError, TypeError), match=match):
            Weights.of(bad, 2)


def test_naive_step_rounding_would_take_rows_back() -> None:
    """Why the counts are a row sequence: largest remainder on cumulative targets per step
    asks a source to give back a row (Alabama) where the row sequence never does."""
    weights, g = [100, 1000, 7, 2, 1000, 3], 12
    w = Weights.of(weights, len(weights))
    counts = (0,) * len(weights)
    for _ in range(60):
        nxt = w.counts_after(counts, g)
        assert all(b >= a for a, b in zip(counts, nxt, strict=True))
        counts = nxt


def test_weights_by_size_fit_the_kernel_for_billions_of_rows() -> None:
    from loader.mixture.dataset import by_size

    assert Weights.of(by_size([60_000, 30_000, 10_000]), 3).shares == (6, 3, 1)
    big = Weights.of(by_size([3_000_000_000, 1_000_000_000, 7, 0]), 4)
    assert big.period <= 2**20 + 4 and big.shares[2] == 1 and big.shares[3] == 0
    assert abs(Fraction(big.shares[0], big.shares[1]) - 3) < Fraction(1, 10**5)


@settings(max_examples=60)
@given(
    st.integers(1, 60), st.integers(1, 8), st.booleans(), st.integers(0, 2**64 - 1),
    st.integers(0, 50), st.integers(1, 5), st.data(),
)  # fmt: skip
def test_passes_kernel_matches_one_epoch_at_a_time(
    n: int, clump: int, shuffle: bool, seed: int, first: int, passes: int, data: st.DataObject
) -> None:
    from loader.plan import PlanSpec

    spec = PlanSpec(n, 1, shuffle, seed, clump)
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=20)), dtype=np.int64)
    want = [spec.epoch(first + p).order(idx).tolist() for p in range(passes)]
    got = spec.epoch(first).order_of_passes(passes, idx).tolist()
    assert got == [x for w in want for x in w]
    c = min(clump, n) if shuffle else n
    assert got == reference.passes_positions(n, c, seed, first, passes, idx.tolist())
