"""Hypothesis strategies shared by the property tests: a job saved on W ranks, resumed on W'."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from loader.layout import supported_world_sizes


@st.composite
def resize_jobs(
    draw: st.DrawFn,
    splits_from: list[int],
    max_rows: int = 600,
    max_batch: int = 40,
    max_seed: int = 2**32,
    max_clump: int = 40,
    max_epoch: int = 3,
) -> dict[str, Any]:
    """(N, S, shuffle, seed, C, epoch), a world and batch before and after, and where to cut.

    `cut` is the share of the epoch read before the crash; W and W' both divide S.
    """
    splits = draw(st.sampled_from(splits_from))
    sizes = supported_world_sizes(splits)
    return {
        "rows": draw(st.integers(splits, max_rows)),
        "num_splits": splits,
        "shuffle": draw(st.booleans()),
        "shuffle_seed": draw(st.integers(0, max_seed)),
        "shuffle_clump_size": draw(st.integers(1, max_clump)),
        "epoch": draw(st.integers(0, max_epoch)),
        "world": draw(st.sampled_from(sizes)),
        "new_world": draw(st.sampled_from(sizes)),
        "batch": draw(st.integers(1, max_batch)),
        "new_batch": draw(st.integers(1, max_batch)),
        "drop_last": draw(st.booleans()),
        "cut": draw(st.floats(0, 1)),
    }
