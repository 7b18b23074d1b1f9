"""`skip_steps` at the joints (issue 24 items 4-5): out of order (`in_order=False`), exactly
the steps asked are skipped and every other row comes once; a range not yet reached is in
the state and survives a resume on any W; registering a range twice is a no-op."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from loader import StreamingDataLoader, StreamingDataset, checkpoint
from tests.batches import ids
from tests.tables import make_rows

B = 4  # rows a batch; with one split and no shuffle, step t holds rows [t*B, (t+1)*B)


def _slow_rows(row: dict[str, Any]) -> dict[str, Any]:
    if row["id"] in (8, 12):  # steps 2 and 3: later batches overtake them
        time.sleep(0.3)
    return row


def rows_of(steps: range) -> set[int]:
    return {i for t in steps for i in range(t * B, (t + 1) * B)}


@pytest.mark.slow  # starts worker processes
def test_out_of_order_with_workers_skips_exactly_the_steps_asked(tmp_path: Path) -> None:
    """The issue's case: one rank, in_order=False, skip_steps(4, 7); batches 3, 5 and 7
    came twice and 6 were lost, and the state counted 12 rows skipped where 24 were missing."""
    table = make_rows(0, 12 * B)
    ds = StreamingDataset(table, columns=["id"], num_splits=1, shuffle=False, transform=_slow_rows)
    dl = StreamingDataLoader(
        ds, batch_size=B, num_workers=2, in_order=False, read_size=B, persistent_workers=True
    )
    dl.skip_steps(4, 7)
    head = list(itertools.islice(dl, 5))
    state = dl.state_dict()
    path = checkpoint.save(state, tmp_path / "mid.json")
    rest = list(dl)
    got = [i for batch in ids(head + rest) for i in batch]
    assert sorted(got) == sorted(rows_of(range(12)) - rows_of(range(4, 7))), got
    assert dl.state_dict()["steps_skipped"] == [[4, 7, 3 * B]]
    resumed = StreamingDataLoader(
        StreamingDataset(table, columns=["id"], num_splits=1, shuffle=False), batch_size=B
    )
    resumed.load_state_dict(checkpoint.load(path))
    again = [i for batch in ids(resumed) for i in batch]
    assert sorted(again + [i for b in ids(head) for i in b]) == sorted(got)


class _OutOfOrder(StreamingDataLoader):
    """A loader whose reads finish out of order, as workers' do with in_order=False: pairs
    (index, batch) held in a window and handed out in a seeded random order."""

    def __init__(self, *a: Any, order_seed: int = 0, window: int = 3, **kw: Any) -> None:
        super().__init__(*a, in_order=False, **kw)
        self._random, self._window = random.Random(order_seed), window

    def _batches(self, stream: Any) -> Iterator[Any]:
        held: list[Any] = []
        for pair in super()._batches(stream):
            held.append(pair)
            if len(held) >= self._window:
                yield held.pop(self._random.randrange(len(held)))
        while held:
            yield held.pop(self._random.randrange(len(held)))


def _dataset(rows: int, splits: int, rank: int = 0, world: int = 1) -> StreamingDataset:
    return StreamingDataset(
        make_rows(0, rows), columns=["id"], num_splits=splits, shuffle_seed=3, rank=rank,
        world_size=world,
    )  # fmt: skip


def _steps(rows: int, splits: int, g: int, epochs: int = 2) -> list[set[int]]:
    """Each global step's rows, from an uninterrupted run on one rank."""
    dl = StreamingDataLoader(_dataset(rows, splits), global_batch_size=g)
    return [set(b) for _ in range(epochs) for b in ids(dl)]


@settings(max_examples=40)
@given(
    splits=hs.sampled_from([1, 2, 4]),
    per_split=hs.integers(3, 9),
    skips=hs.lists(hs.tuples(hs.integers(0, 14), hs.integers(1, 4)), min_size=1, max_size=2),
    stop_after=hs.integers(0, 12),
    world=hs.sampled_from([1, 2, 4]),
    out_of_order=hs.booleans(),
    order_seed=hs.integers(0, 99),
)
def test_exactly_the_steps_asked_are_skipped_on_any_world_and_order(
    splits: int,
    per_split: int,
    skips: list[tuple[int, int]],
    stop_after: int,
    world: int,
    out_of_order: bool,
    order_seed: int,
) -> None:
    """Two epochs with ranges registered before reading (one may cross the epoch's end),
    stopped after `stop_after` batches (the state taken there), resumed on `world` ranks
    without registering the ranges again: every step outside the ranges once, none inside."""
    rows, g = splits * per_split * 4, splits * 4  # steps of G rows; an epoch of per_split steps
    expected = _steps(rows, splits, g)
    beyond = _steps(rows, splits, g, epochs=4)  # a range may be jumped past the 2 epochs read
    first: StreamingDataLoader
    if out_of_order:
        first = _OutOfOrder(_dataset(rows, splits), global_batch_size=g, order_seed=order_seed)
    else:
        first = StreamingDataLoader(_dataset(rows, splits), global_batch_size=g)
    skipped: set[int] = set()
    for start, length in skips:
        first.skip_steps(start, start + length)
        first.skip_steps(start, start + length)  # twice: a no-op
        skipped |= set(range(start, start + length))
    total = len(expected)
    got: list[int] = []
    handed = 0
    while handed < stop_after and first.progress.position()[0] < 2:  # up to stop_after batches
        for batch in first:
            got += batch["id"].tolist()
            handed += 1
            if handed == stop_after:
                break
    state = first.state_dict()
    ranks = [
        StreamingDataLoader(_dataset(rows, splits, r, world), global_batch_size=g)
        for r in range(world)
    ]
    ahead = "batches_ahead" in state
    if ahead and world > 1:  # out of order, a resume takes the same world size (refused)
        return
    for dl in ranks:
        dl.load_state_dict(state)
    while min(dl.progress.position()[0] for dl in ranks) < 2:
        epoch = ranks[0].progress.position()[0]
        for batches in zip(*[list(dl) for dl in ranks], strict=True):
            got += [i for b in batches for i in b["id"].tolist()]
        assert all(dl.progress.position()[0] > epoch for dl in ranks)
    want = [i for t in range(total) if t not in skipped for i in expected[t]]
    assert sorted(got) == sorted(want)
    jumped = ranks[0].state_dict().get("steps_skipped", [])
    for start, stop, units in jumped:  # the units each range's steps hold, exactly
        assert set(range(start, stop)) <= skipped
        assert units == sum(len(beyond[t]) for t in range(start, stop))
    assert {t for a, b, _ in jumped for t in range(a, b)} >= {t for t in skipped if t < total}


def test_a_pending_range_is_in_the_state_and_skipped_after_a_resume_on_another_world() -> None:
    dl = StreamingDataLoader(_dataset(64, 4), global_batch_size=8)  # 8 steps an epoch
    whole = [set(b) for b in ids(StreamingDataLoader(_dataset(64, 4), global_batch_size=8))]
    dl.skip_steps(5, 7)
    head = list(itertools.islice(dl, 2))
    state = dl.state_dict()
    assert state["skips_pending"] == [[5, 7]]
    ranks = [StreamingDataLoader(_dataset(64, 4, r, 2), global_batch_size=8) for r in range(2)]
    for rank in ranks:
        rank.load_state_dict(state)
    rest = [set(a["id"].tolist()) | set(b["id"].tolist()) for a, b in zip(*ranks, strict=True)]
    assert [set(b["id"].tolist()) for b in head] + rest == whole[:5] + whole[7:]
    after = ranks[1].state_dict()
    assert "skips_pending" not in after and after["steps_skipped"] == [[5, 7, 16]]
    ranks[0].skip_steps(5, 7)  # registered again after the fact (a config read at every start)
    with pytest.raises(ValueError, match="behind the position"):
        ranks[0].skip_steps(2, 4)  # read, not skipped: cannot be undone


def _mix(rank: int = 0, world: int = 1) -> Any:
    from loader import MixedDataset

    a = StreamingDataset(
        make_rows(0, 40), columns=["id"], num_splits=2, rank=rank, world_size=world
    )
    b = StreamingDataset(
        make_rows(1000, 1030), columns=["id"], num_splits=2, rank=rank, world_size=world
    )
    return MixedDataset([a, b], [1, 1])


def test_a_mixture_keeps_its_pending_range_in_the_state() -> None:
    whole = StreamingDataLoader(_mix(), global_batch_size=4)
    whole.skip_steps(3, 5)
    expected = [set(b) for b in ids(itertools.islice(whole, 6))]
    dl = StreamingDataLoader(_mix(), global_batch_size=4)
    dl.skip_steps(3, 5)
    dl.skip_steps(3, 5)  # a no-op
    head = [set(b) for b in ids(itertools.islice(dl, 2))]
    state = dl.state_dict()
    assert state["skips_pending"] == [[3, 5]]
    ranks = [StreamingDataLoader(_mix(r, 2), global_batch_size=4) for r in range(2)]
    for rank in ranks:
        rank.load_state_dict(state)
    rest = [
        set(a["id"].tolist()) | set(b["id"].tolist())
        for a, b in itertools.islice(zip(*ranks, strict=True), 4)
    ]
    assert head + rest == expected
    assert ranks[0].state_dict()["steps_skipped"] == [[3, 5]]


def test_a_malformed_pending_range_is_refused_naming_it() -> None:
    dl = StreamingDataLoader(_dataset(64, 4), global_batch_size=8)
    dl.skip_steps(5, 7)
    state = dl.state_dict()
    for bad, why in (([[7, 5]], "start must be below stop"), ([[1]], r"expected \[start, stop\]")):
        with pytest.raises(ValueError, match=rf"skips_pending\[0\].*{why}"):
            StreamingDataLoader(_dataset(64, 4), global_batch_size=8).load_state_dict(
                {**state, "skips_pending": bad}
            )
