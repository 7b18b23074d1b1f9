"""One owner of the position (loader/progress.py): step, global_step, loads and old states.

Through the real loader on real tables: a state written before the progress object existed
still resumes exactly, `global_step` counts batches across epochs and resumes, a load takes
effect when the next iteration starts, and loaders sharing a dataset share its position.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest

from loader import StreamingDataLoader, StreamingDataset
from tests.batches import ids
from tests.tables import make_rows

FIXTURE = Path(__file__).parent / "fixtures" / "state-before-progress.json"


def test_a_state_written_before_the_progress_object_resumes_exactly() -> None:
    """Saved by the loader as it was before loader/progress.py (no `global_step` key)."""
    saved = orjson.loads(FIXTURE.read_bytes())
    assert "global_step" not in saved["state"]
    # the fixture's own source identity belongs to the sources' code; the position is what
    # this test is about, so a change of fingerprint scheme must not hide it
    ds = StreamingDataset(
        make_rows(0, 600),
        num_splits=4,
        shuffle_seed=11,
        shuffle_clump_size=5,
        allow_source_change=True,
    )
    dl = StreamingDataLoader(ds, batch_size=32)
    dl.load_state_dict(saved["state"])
    assert (dl.step, dl.global_step, len(dl)) == (5, 5, 19)
    assert ids(dl) == saved["rest"]
    # the batch in hand is epoch 0's 19th; the position after it is epoch 1's start
    assert (dl.step, dl.global_step, dl.streaming_dataset.epoch) == (19, 19, 0)
    state = dl.state_dict()
    assert (state["epoch"], state["step"], set(state["cursors"])) == (1, 0, {0})


def test_global_step_counts_batches_across_epochs_for_loops_and_resumes(lance_rows: Any) -> None:
    dl = StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), batch_size=64)
    assert dl.global_step == 0
    list(dl)  # 10 batches
    head = list(itertools.islice(dl, 3))
    assert len(head) == 3 and (dl.step, dl.global_step) == (3, 13)
    list(dl)  # a new `for` finishes epoch 1: 7 more
    # the batch in hand is epoch 1's last; the position after it is epoch 2's start
    assert (dl.step, dl.global_step, dl.progress.epoch) == (10, 20, 1)
    assert dl.progress.position() == (2, (0, 0, 0, 0), 0)
    next(iter(dl))
    state = dl.state_dict()
    assert (state["step"], state["global_step"]) == (1, 21)
    resumed = StreamingDataLoader(
        StreamingDataset(lance_rows, num_splits=4, rank=1, world_size=2), batch_size=32
    )
    resumed.load_state_dict(state)
    assert (resumed.step, resumed.global_step) == (1, 21)
    rest = list(resumed)
    assert resumed.global_step == 21 + len(rest) and resumed.step == 1 + len(rest)


def test_a_load_takes_effect_when_the_next_iteration_starts(lance_rows: Any) -> None:
    dl = StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), batch_size=50)
    saved_after_two = None
    running = iter(dl)
    for step, _ in enumerate(running, start=1):
        if step == 2:
            saved_after_two = dl.state_dict()
        if step == 5:
            break
    assert saved_after_two is not None
    expected = ids(itertools.islice(iter(dl), 7))  # the batches after step 5, for comparison
    dl.load_state_dict(saved_after_two)
    assert dl.state_dict() == saved_after_two
    next(running, None)  # the iteration that was running when the state was loaded
    assert dl.state_dict() == saved_after_two, "a stale iteration moves nothing"
    again = ids(dl)
    assert again[3:] == expected, "the next `for` starts at the loaded position"
    assert len(again) == 10


def test_a_second_loader_over_a_drawn_dataset_continues_its_epoch_and_step(
    lance_rows: Any,
) -> None:
    """Deliberate: the dataset owns the position. len() and step agree with its cursors."""
    ds = StreamingDataset(lance_rows, num_splits=4)
    first = StreamingDataLoader(ds, batch_size=25)
    taken = ids(itertools.islice(first, 1))
    second = StreamingDataLoader(ds, batch_size=25)
    assert sum(second.state_dict()["cursors"]) == 25
    assert (second.step, len(second)) == (1, 24), "step counts the batch the cursors show"
    rest = ids(second)
    assert len(rest) == 23
    assert sorted(i for b in taken + rest for i in b) == list(range(600))


def test_the_dataset_and_its_loader_share_one_position(lance_rows: Any) -> None:
    ds = StreamingDataset(lance_rows, num_splits=4)
    rows = list(itertools.islice(ds, 100))  # row by row: a "batch" is a row
    assert ds.state_dict()["step"] == 100 and sum(ds.state_dict()["cursors"]) == 100
    dl = StreamingDataLoader(ds, batch_size=100)
    rest = [i for b in ids(dl) for i in b]
    assert sorted([r["id"] for r in rows] + rest) == list(range(600))
    assert ds.epoch == 0 and dl.state_dict()["cursors"] == [0, 0, 0, 0]
    assert dl.state_dict()["epoch"] == 1


def test_shuffle_seed_none_picks_a_seed_that_the_state_carries(arrow_rows: Any) -> None:
    """LanceDB documents shuffle_seed=None as "pick a random seed": picked once, saved, and
    adopted by a resume (also built with None), so the resume reads the rest exactly."""
    picked = StreamingDataset(arrow_rows, num_splits=4, shuffle_seed=None)
    other = StreamingDataset(arrow_rows, num_splits=4, shuffle_seed=None)
    assert 0 <= picked.shuffle_seed < 2**63 and picked.shuffle_seed != other.shuffle_seed
    dl = StreamingDataLoader(picked, batch_size=50)
    head = ids(itertools.islice(dl, 4))
    state = dl.state_dict()
    assert state["plan"]["shuffle_seed"] == picked.shuffle_seed
    rest = ids(dl)
    resumed = StreamingDataLoader(other, batch_size=50)
    resumed.load_state_dict(state)
    assert other.shuffle_seed == picked.shuffle_seed
    assert ids(resumed) == rest
    assert sorted(i for b in head + rest for i in b) == list(range(600))
    fixed = StreamingDataLoader(StreamingDataset(arrow_rows, num_splits=4, shuffle_seed=1))
    with pytest.raises(ValueError, match=r"plan\.shuffle_seed="):
        fixed.load_state_dict(state)


def test_shuffle_seed_none_without_torch_distributed_on_several_ranks_is_refused(
    arrow_rows: Any,
) -> None:
    with pytest.raises(ValueError, match="shuffle_seed=None picks a seed on rank 0"):
        StreamingDataset(arrow_rows, num_splits=4, shuffle_seed=None, rank=1, world_size=2)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_the_epoch_is_the_batch_in_hands_until_the_next_one(lance_rows: Any, workers: int) -> None:
    """A loop that logs `ds.epoch` with each step labels every step of epoch 0 with 0, the
    last one too (LitData's `current_epoch`); the state after it is epoch 1's start."""
    ds = StreamingDataset(lance_rows, num_splits=4, shuffle_seed=3)
    dl = StreamingDataLoader(ds, batch_size=64, num_workers=workers)
    for epoch in range(2):
        labels = [(ds.epoch, dl.step) for _ in dl]
        assert labels == [(epoch, step) for step in range(1, 11)], labels
        state = dl.state_dict()
        assert (state["epoch"], state["step"], set(state["cursors"])) == (epoch + 1, 0, {0})
    assert len(dl) == 10  # the next epoch's batches: the position's epoch


def test_skipping_a_range_of_steps_at_a_resume_reads_every_other_row_once(
    lance_rows: Any,
) -> None:
    """Megatron's --skip-train-iteration-range: resume, jump over global steps [12, 15)
    (a loss spike's data), which are counted in the state; every other row once, on any W."""
    full = StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), global_batch_size=64)
    steps = ids(full)  # 10 steps of one epoch, the last one short (600 rows)
    ranks = []
    for rank in range(3):  # resume on 3 ranks, as a loss-spike restart on fewer GPUs would
        ds = StreamingDataset(lance_rows, num_splits=4, rank=rank, world_size=3)
        dl = StreamingDataLoader(ds, global_batch_size=64)
        dl.skip_steps(3, 6)
        ranks.append(dl)
    got = [ids(dl) for dl in ranks]
    assert {len(g) for g in got} == {7}, "the same number of steps on every rank"
    per_step = [sorted(i for g in got for i in g[t]) for t in range(7)]
    assert per_step == [sorted(s) for s in steps[:3] + steps[6:]]
    state = ranks[0].state_dict()
    assert state["epoch"] == 1 and state["steps_skipped"] == [[3, 6, 192]]
    with pytest.raises(ValueError, match="behind the position"):
        ranks[0].skip_steps(0, 5)


def test_a_skip_in_the_middle_of_a_loop_and_past_the_epoch_end(lance_rows: Any) -> None:
    dl = StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), batch_size=64)
    whole = ids(StreamingDataLoader(StreamingDataset(lance_rows, num_splits=4), batch_size=64))
    dl.skip_steps(8, 12)  # the last 2 steps of epoch 0 and the first 2 of epoch 1
    assert ids(dl) == whole[:8]
    second = ids(dl)
    assert len(second) == 8 and dl.global_step == 20
    assert dl.state_dict()["steps_skipped"] == [[8, 10, 88], [10, 12, 128]]
