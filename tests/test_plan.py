"""The epoch plan as the contract states it: a pure function of (N, S, shuffle, seed, C, epoch)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.plan import PlanSpec, check_world_size, owned_splits, supported_world_sizes

GOLDEN = {
    # (N, S, shuffle, seed, C): first 8 positions of epochs 0 and 1. A change here means the
    # generator changed, which silently changes every user's data order: bump the state
    # format version if that is ever intended.
    (10, 2, True, 0, 1): [[1, 3, 6, 4, 2, 9, 7, 8], [6, 9, 8, 4, 5, 2, 1, 3]],
    (1000, 8, True, 42, 64): [list(range(576, 584)), list(range(896, 904))],
    (100, 4, True, 7, 3): [[72, 73, 74, 30, 31, 32, 12, 13], [57, 58, 59, 84, 85, 86, 51, 52]],
    (12, 3, False, 0, 1): [list(range(8)), list(range(8))],
}


@pytest.mark.parametrize("args", sorted(GOLDEN))
def test_golden_first_rows(args: tuple[int, int, bool, int, int]) -> None:
    spec = PlanSpec(*args)
    got = [spec.epoch(e).order(np.arange(8)).tolist() for e in (0, 1)]
    assert got == GOLDEN[args]


plans = st.builds(
    PlanSpec,
    num_rows=st.integers(1, 500),
    num_splits=st.just(1),
    shuffle=st.booleans(),
    shuffle_seed=st.integers(0, 2**40),
    clump_size=st.integers(1, 600),
).flatmap(
    lambda p: st.builds(
        PlanSpec,
        num_rows=st.just(p.num_rows),
        num_splits=st.integers(1, p.num_rows),
        shuffle=st.just(p.shuffle),
        shuffle_seed=st.just(p.shuffle_seed),
        clump_size=st.just(p.clump_size),
    )
)


@settings(max_examples=300)
@given(spec=plans, epoch=st.integers(0, 20))
def test_splits_are_disjoint_equal_and_drop_the_shuffled_tail(spec: PlanSpec, epoch: int) -> None:
    plan = spec.epoch(epoch)
    n, length = spec.num_rows, spec.rows_per_split
    order = plan.order(np.arange(n))
    assert sorted(order.tolist()) == list(range(n))
    splits = [plan.split_rows(s) for s in range(spec.num_splits)]
    assert all(len(s) == length for s in splits)
    kept = np.concatenate(splits)
    assert len(set(kept.tolist())) == spec.num_splits * length
    # the surplus is the tail of the shuffled order, fewer than S rows
    assert kept.tolist() == order[: spec.num_splits * length].tolist()
    assert spec.rows_dropped < spec.num_splits


@settings(max_examples=200)
@given(spec=plans, epoch=st.integers(0, 20))
def test_clumps_stay_contiguous(spec: PlanSpec, epoch: int) -> None:
    order = spec.epoch(epoch).order(np.arange(spec.num_rows))
    clump = spec.clump_size if spec.shuffle else spec.num_rows
    starts = np.flatnonzero(order % clump == 0)
    for start in starts:
        run = order[start : start + min(clump, spec.num_rows - order[start])]
        assert run.tolist() == list(range(order[start], order[start] + len(run)))


def test_other_epoch_or_seed_gives_another_order() -> None:
    base = PlanSpec(10_000, 8, True, 3, 1)
    first = base.epoch(0).order(np.arange(10_000))
    assert not np.array_equal(first, base.epoch(1).order(np.arange(10_000)))
    other = PlanSpec(10_000, 8, True, 4, 1).epoch(0).order(np.arange(10_000))
    assert not np.array_equal(first, other)
    # and the dropped tail differs between epochs
    spec = PlanSpec(1003, 10, True, 0, 1)
    tails = {tuple(sorted(spec.epoch(e).order(np.arange(1000, 1003)).tolist())) for e in range(5)}
    assert len(tails) > 1


def test_same_plan_in_a_fresh_process() -> None:
    code = (
        "import numpy as np; from loader.plan import PlanSpec;"
        "print(PlanSpec(123457, 48, True, 99, 16).epoch(5).order(np.arange(0, 123457, 977)).tolist())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = PlanSpec(123457, 48, True, 99, 16).epoch(5).order(np.arange(0, 123457, 977)).tolist()
    assert out.stdout.strip() == str(here)


def test_first_batch_of_a_billion_rows_needs_no_o_n_memory() -> None:
    """Positions of one batch of a 1e9-row plan: peak RSS grows by far less than 8 GB."""
    code = (
        "import resource, numpy as np; from loader.plan import PlanSpec;"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "plan = PlanSpec(10**9, 48, True, 1, 1).epoch(0);"
        "rows = plan.split_rows(17, 0, 1024);"
        "plan64 = PlanSpec(10**9, 48, True, 1, 64).epoch(3); rows64 = plan64.split_rows(40, 5000, 6024);"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        "print(after - before, len(set(rows.tolist())), len(set(rows64.tolist())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown_kib, unique, unique64 = (int(x) for x in out.stdout.split())
    assert unique == unique64 == 1024
    assert grown_kib < 64 * 1024, f"plan grew RSS by {grown_kib} KiB for one batch of 1e9 rows"


def test_supported_world_sizes_and_errors() -> None:
    assert supported_world_sizes(48) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    with pytest.raises(
        ValueError, match=r"supports world sizes \[1, 2, 3, 4, 6, 8, 12, 16, 24, 48\]"
    ):
        check_world_size(48, 5)
    with pytest.raises(ValueError, match=r"rank should be in the interval \[0, 3\]"):
        owned_splits(4, 4, 8)
    with pytest.raises(ValueError, match="smaller than num_splits=8"):
        PlanSpec(7, 8)
    assert owned_splits(2, 4, 8) == range(4, 6)
