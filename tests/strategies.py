"""Hypothesis strategies shared by the property tests: a job saved on W ranks, resumed on W'."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from loader.layout import supported_world_sizes


@st.composite
def batchings(
    draw: st.DrawFn, splits: int, max_batch: int, max_world: int
) -> tuple[int, int | None, int | None]:
    """(W, per-rank batch, global batch G) of one layout (`loader.layout`):

    - the split layout: W divides S, any per-rank batch (G = W * b);
    - the step layout: G a multiple of S and any W <= G, divisor of S or not, W > S too.
    """
    if draw(st.booleans()):
        world = draw(st.sampled_from([w for w in supported_world_sizes(splits) if w <= max_world]))
        return world, draw(st.integers(1, max_batch)), None
    global_batch = splits * draw(st.integers(1, max(1, max_batch // splits + 1)))
    return draw(st.integers(1, min(global_batch, max_world))), None, global_batch


@st.composite
def resize_jobs(
    draw: st.DrawFn,
    splits_from: list[int],
    max_rows: int = 600,
    max_batch: int = 40,
    max_seed: int = 2**32,
    max_clump: int = 40,
    max_epoch: int = 3,
    max_world: int = 64,
) -> dict[str, Any]:
    """(N, S, shuffle, seed, C, epoch), a world and batching before and after, where to cut.

    `cut` is the share of the epoch read before the crash. W and W' are free: divisors of
    S with any per-rank batch, or any W <= G with G a multiple of S (`batchings`).
    """
    splits = draw(st.sampled_from(splits_from))
    world, batch, global_batch = draw(batchings(splits, max_batch, max_world))
    new_world, new_batch, new_global = draw(batchings(splits, max_batch, max_world))
    return {
        "rows": draw(st.integers(splits, max_rows)),
        "num_splits": splits,
        "shuffle": draw(st.booleans()),
        "shuffle_seed": draw(st.integers(0, max_seed)),
        "shuffle_clump_size": draw(st.integers(1, max_clump)),
        "epoch": draw(st.integers(0, max_epoch)),
        "world": world,
        "new_world": new_world,
        "batch": batch,
        "new_batch": new_batch,
        "global_batch": global_batch,
        "new_global_batch": new_global,
        "drop_last": draw(st.booleans()),
        "cut": draw(st.floats(0, 1)),
    }
