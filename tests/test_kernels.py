"""Each kernel equals its plain-Python twin in tests/reference.py."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.kernels.permute import (
    _order_positions,
    _permute,
    _unpermute,
    half_bits_for,
    mix64,
    round_keys,
)
from loader.kernels.rows import _place_rows
from loader.kernels.stream import _advance, _runs_order, _slice_runs, _task_order
from loader.layout import slice_bounds
from loader.plan import PlanSpec
from tests import reference

seeds = st.integers(0, 2**63 - 1)


@given(st.integers(0, 2**64 - 1))
def test_mix64_matches_twin(value: int) -> None:
    assert mix64(value) == reference.mix(value)


@settings(max_examples=200)
@given(n=st.integers(1, 300), seed=seeds, epoch=st.integers(0, 50))
def test_permute_is_the_twins_bijection(n: int, seed: int, epoch: int) -> None:
    keys = round_keys(seed, epoch, n, 1)
    half = half_bits_for(n)
    want = reference.permutation(n, [int(k) for k in keys], half)
    got = [_permute(i, n, keys, half) for i in range(n)]
    assert got == want
    assert sorted(got) == list(range(n))
    assert [_unpermute(j, n, keys, half) for j in got] == list(range(n))


@settings(max_examples=300)
@given(
    n=st.integers(1, 400),
    clump=st.integers(1, 500),
    seed=seeds,
    epoch=st.integers(0, 9),
    shuffle=st.booleans(),
)
def test_epoch_order_matches_twin(n: int, clump: int, seed: int, epoch: int, shuffle: bool) -> None:
    """Covers N < C, C = 1, C >= N and a ragged last clump."""
    plan = PlanSpec(n, 1, shuffle, seed, clump).epoch(epoch)
    c = min(clump, n) if shuffle else n
    keys = [int(k) for k in round_keys(seed, epoch, n, c)]
    want = reference.epoch_order(n, c, keys, half_bits_for(-(-n // c)))
    got = plan.order(np.arange(n, dtype=np.int64)).tolist()
    assert got == want
    if not shuffle:
        assert got == list(range(n))


@given(
    n=st.integers(1, 300),
    clump=st.integers(1, 64),
    seed=seeds,
    idx=st.lists(st.integers(0, 10**9), max_size=40),
)
def test_order_positions_any_indices(n: int, clump: int, seed: int, idx: list[int]) -> None:
    """Random-access slices agree with the full order, whatever order they are asked in."""
    plan = PlanSpec(n, 1, True, seed, clump).epoch(0)
    full = plan.order(np.arange(n, dtype=np.int64))
    pick = np.array([i % n for i in idx], dtype=np.int64)
    assert plan.order(pick).tolist() == full[pick].tolist()


cursor_cases = st.integers(1, 30).flatmap(
    lambda length: st.tuples(
        st.just(length), st.lists(st.integers(0, length), min_size=1, max_size=8)
    )
)


@settings(max_examples=300)
@given(case=cursor_cases, data=st.data())
def test_advance_slice_runs_and_runs_order_match_twins(
    case: tuple[int, list[int]], data: st.DataObject
) -> None:
    """A step of `count` rows from cursors after `consumed`: the cursors, a rank's runs of
    it, and their order, each against its twin; the whole step's order is the stream's."""
    length, cursors = case
    full = reference.stream(cursors, length)
    consumed = data.draw(st.integers(0, len(full)))
    count = data.draw(st.integers(0, len(full) - consumed))
    arr = np.array(cursors, dtype=np.int64)
    before = _advance(arr, consumed, length)
    assert before.tolist() == reference.advance(cursors, consumed, length)
    after = _advance(before, count, length)
    world = data.draw(st.integers(1, max(1, count)))
    rank = data.draw(st.integers(0, world - 1))
    lo, hi = slice_bounds(rank, world, count)
    splits, starts, stops = _slice_runs(before, after, lo, hi)
    runs = list(zip(splits.tolist(), starts.tolist(), stops.tolist(), strict=True))
    assert runs == reference.slice_runs(before.tolist(), after.tolist(), lo, hi)
    assert _runs_order(splits, starts, stops, length).tolist() == reference.runs_order(runs, length)
    whole = _slice_runs(before, after, 0, count)
    stream_order = [s * length + level for s, level in full[consumed : consumed + count]]
    assert _runs_order(*whole, length).tolist() == stream_order


@settings(max_examples=200)
@given(case=cursor_cases, data=st.data())
def test_task_order_is_each_batchs_runs_order_end_to_end(
    case: tuple[int, list[int]], data: st.DataObject
) -> None:
    """A task of consecutive batches (each a rank's runs of a step): `_task_order` gives
    the twin's order of each batch's runs, batch after batch, in one call."""
    length, cursors = case
    full = len(reference.stream(cursors, length))
    cut = sorted(data.draw(st.lists(st.integers(0, full), max_size=5)))
    world = data.draw(st.integers(1, 3))
    rank = data.draw(st.integers(0, world - 1))
    arr = np.array(cursors, dtype=np.int64)
    tables, counts, expected = [], [], []
    for a, b in itertools.pairwise([0, *cut, full]):
        before, after = _advance(arr, a, length), _advance(arr, b, length)
        lo, hi = slice_bounds(rank, world, b - a)
        runs = list(zip(*(r.tolist() for r in _slice_runs(before, after, lo, hi)), strict=True))
        tables.extend(runs)
        counts.append(len(runs))
        expected.extend(reference.runs_order(runs, length))
    table = np.array(tables, dtype=np.int64).reshape(-1, 3)
    got = _task_order(table, np.array(counts, dtype=np.int64), length)
    assert got.tolist() == expected


def test_order_positions_of_empty_selection() -> None:
    plan = PlanSpec(10, 2, True, 1, 3).epoch(0)
    clump, n_clumps, short_slot, short_len, half = plan._layout
    out = _order_positions(
        np.empty(0, dtype=np.int64), clump, n_clumps, short_slot, short_len, plan._keys, half
    )
    assert out.shape == (0,)


@given(n=st.integers(1, 300), clump=st.integers(1, 64), seed=seeds, data=st.data())
def test_order_range_equals_order_of_indices(
    n: int, clump: int, seed: int, data: st.DataObject
) -> None:
    plan = PlanSpec(n, 1, True, seed, clump).epoch(2)
    start = data.draw(st.integers(0, n))
    count = data.draw(st.integers(0, n - start))
    want = plan.order(np.arange(start, start + count, dtype=np.int64))
    assert plan.order_range(start, count).tolist() == want.tolist()


@given(
    src_rows=st.integers(1, 20),
    width=st.integers(1, 12),
    dest_rows=st.integers(0, 30),
    word=st.sampled_from(["u1", "u2", "u4", "u8"]),
    data=st.data(),
)
def test_place_rows_matches_twin(
    src_rows: int, width: int, dest_rows: int, word: str, data: st.DataObject
) -> None:
    src = (np.arange(src_rows * width).reshape(src_rows, width) % 251).astype(word)
    dest = np.full((dest_rows, width), 255, dtype=word)
    places = st.lists(st.integers(0, dest_rows - 1), unique=True) if dest_rows else st.just([])
    at = data.draw(places)
    rows = [data.draw(st.integers(0, src_rows - 1)) for _ in at]
    want = reference.place_rows(src.tolist(), rows, dest.tolist(), at)
    _place_rows(src, np.array(rows, dtype=np.int64), dest, np.array(at, dtype=np.int64))
    assert dest.tolist() == want
