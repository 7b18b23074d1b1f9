"""Mixtures through the loader and the state (JSON) on generated jobs: sources and sizes,
weights, S per source, G, W, crash point, W' and new weights (in-memory Arrow tables).
A resume with the same weights and G is the uninterrupted run; any resume gives the same
global steps on every W; new weights hold exactly from the resumed step. (No row twice in
a pass is checked on the plan, tests/test_mixture_plan.py, which these runs equal.)"""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import MixedDataset, StreamingDataLoader, StreamingDataset

BASE = 1000  # source k's ids are k * BASE + row


def tables(k: int, rows: int) -> pa.Table:
    return pa.table({"id": [k * BASE + i for i in range(rows)]})


def loaders(
    job: dict[str, Any], world: int, g: int, weights: list[int]
) -> list[StreamingDataLoader]:
    out = []
    for rank in range(world):
        kw = {"rank": rank, "world_size": world}
        datasets = [
            StreamingDataset(tables(k, rows), num_splits=splits, shuffle_seed=k, **kw)
            for k, (rows, splits) in enumerate(job["sources"])
        ]
        out.append(StreamingDataLoader(MixedDataset(datasets, weights), global_batch_size=g))
    return out


def global_steps(dls: list[StreamingDataLoader], count: int) -> list[list[int]]:
    out: list[list[int]] = []
    while len(out) < count:
        for batches in zip(*dls, strict=True):
            ids = sorted(i for b in batches for i in b["id"].tolist())
            for b in batches:
                assert (b["source"] == b["id"] // BASE).all()
            out.append(ids)
            if len(out) == count:
                break
    return out


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(1, 3))
    sources = [(draw(st.integers(4, 30)), draw(st.integers(1, 4))) for _ in range(count)]
    weights = draw(st.lists(st.integers(0, 5), min_size=count, max_size=count))
    new = draw(st.lists(st.integers(0, 5), min_size=count, max_size=count))
    weights[0], new[-1] = weights[0] or 1, new[-1] or 1
    g = draw(st.integers(1, 12))
    return {
        "sources": sources, "weights": weights, "new": new, "g": g,
        "world": draw(st.integers(1, min(g, 4))), "crash": draw(st.integers(0, 8)),
        "g2": (g2 := draw(st.integers(1, 12))), "world2": draw(st.integers(1, min(g2, 4))),
    }  # fmt: skip


def shares_hold(steps: list[list[int]], weights: list[int], g: int) -> None:
    counts: Counter[int] = Counter()
    for t, ids in enumerate(steps, 1):
        assert len(ids) == g
        counts.update(i // BASE for i in ids)
        for k, w in enumerate(weights):
            assert abs(counts[k] - Fraction(t * g * w, sum(weights))) < 1


def phase(weights: list[int]) -> list[Fraction]:
    return [Fraction(w, sum(weights)) for w in weights]


@settings(max_examples=40)
@given(jobs())
def test_a_resume_from_the_json_state_on_another_world_size_with_new_weights(
    job: dict[str, Any],
) -> None:
    whole = global_steps(loaders(job, 1, job["g"], job["weights"]), job["crash"] + 6)
    first = loaders(job, job["world"], job["g"], job["weights"])
    before = global_steps(first, job["crash"])
    assert before == whole[: job["crash"]]
    shares_hold(before, job["weights"], job["g"])
    state = json.loads(json.dumps(first[0].state_dict()))
    assert all(dl.state_dict() == first[0].state_dict() for dl in first)
    for weights, g, world in (
        (job["weights"], job["g"], min(job["world2"], job["g"])),
        (job["new"], job["g2"], job["world2"]),
    ):
        resumed = loaders(job, world, g, weights)
        for dl in resumed:
            dl.load_state_dict(state)
        after = global_steps(resumed, 6)
        if weights == job["weights"] and g == job["g"]:
            assert after == whole[job["crash"] : job["crash"] + 6]  # as if never stopped
        one = loaders(job, 1, g, weights)
        one[0].load_state_dict(state)
        assert after == global_steps(one, 6)  # the same global steps on every W
        if weights == job["new"] and Fraction(weights[0], sum(weights)) != Fraction(
            job["weights"][0], sum(job["weights"])
        ):
            shares_hold(after, weights, g)  # a new phase from the resumed step
