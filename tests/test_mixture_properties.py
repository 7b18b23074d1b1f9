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
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loader import MixedDataset, StreamingDataLoader, StreamingDataset

BASE = 1000  # source k's ids are k * BASE + row


def tables(k: int, rows: int) -> pa.Table:
    return pa.table({"id": [k * BASE + i for i in range(rows)]})


def rank_datasets(job: dict[str, Any], rank: int, world: int) -> list[StreamingDataset]:
    """The job's datasets as rank `rank` of `world` builds them."""
    return [
        StreamingDataset(
            tables(k, rows), num_splits=splits, shuffle_seed=k, rank=rank, world_size=world
        )
        for k, (rows, splits) in enumerate(job["sources"])
    ]


def loaders(
    job: dict[str, Any], world: int, g: int, weights: list[int]
) -> list[StreamingDataLoader]:
    return [
        StreamingDataLoader(
            MixedDataset(rank_datasets(job, rank, world), weights), global_batch_size=g
        )
        for rank in range(world)
    ]


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


@st.composite
def recipes(draw: st.DrawFn) -> dict[str, Any]:
    """A job with weight phases: a schedule of up to two entries, and maybe one set_weights
    call (made at global step `call`, from step `at` on)."""
    count = draw(st.integers(1, 3))
    sources = [(draw(st.integers(4, 30)), draw(st.integers(1, 4))) for _ in range(count)]

    def weights() -> list[int]:
        out = draw(st.lists(st.integers(0, 5), min_size=count, max_size=count))
        out[0] = out[0] or 1
        return out

    starts = sorted(set(draw(st.lists(st.integers(1, 10), max_size=2))))
    g = draw(st.integers(1, 12))
    call = None
    if draw(st.booleans()):
        at = draw(st.integers(1, 12))
        call = (draw(st.integers(0, at)), weights(), at)
    return {
        "sources": sources, "weights": weights(), "schedule": [(s, weights()) for s in starts],
        "call": call, "g": g, "world": draw(st.integers(1, min(g, 4))),
        "world2": draw(st.integers(1, min(g, 4))), "crash": draw(st.integers(0, 10)),
    }  # fmt: skip


def recipe_loaders(job: dict[str, Any], world: int, resumed: bool) -> list[StreamingDataLoader]:
    out = []
    for rank in range(world):
        declared = {"weights": None} if resumed else {"schedule": job["schedule"]}
        weights = declared.pop("weights", job["weights"])
        mix = MixedDataset(rank_datasets(job, rank, world), weights, **declared)
        out.append(
            StreamingDataLoader(mix, global_batch_size=job["g"], reads_in_flight=0, read_size=1)
        )
    return out


def laid_out(
    dls: list[StreamingDataLoader], job: dict[str, Any], count: int
) -> list[list[list[int]]]:
    """`count` global steps: every rank's ids in layout order (set_weights made on time)."""
    out: list[list[list[int]]] = []
    while len(out) < count:
        its, epoch_steps = [iter(dl) for dl in dls], 0
        while len(out) < count:
            if job["call"] and dls[0].global_step == job["call"][0]:
                for dl in dls:
                    dl.set_weights(job["call"][1], at_step=job["call"][2])
            batches = [next(it, None) for it in its]
            if all(b is None for b in batches):
                assert epoch_steps > 0, f"an epoch without a batch at global step {len(out)}"
                break
            assert None not in batches, f"ranks disagree where an epoch ends: {len(out)}"
            out.append([b["id"].tolist() for b in batches if b is not None])
            epoch_steps += 1
    return out


def phases_of(job: dict[str, Any]) -> list[tuple[int, list[int]]]:
    phases = [(0, job["weights"]), *job["schedule"]]
    if job["call"]:
        _, weights, at = job["call"]
        phases = [p for p in phases if p[0] < at] + [(at, weights)]
    return phases


@settings(max_examples=30, deadline=None)
@given(recipes())
@example(  # set_weights dropping the dataset that ended epochs once made epochs end early
    {"sources": [(4, 1), (5, 1), (4, 1)], "weights": [1, 1, 0], "schedule": [],
     "call": (2, [1, 0, 0], 2), "g": 4, "world": 2, "world2": 1, "crash": 0}
)  # fmt: skip
def test_schedules_and_set_weights_exact_on_every_world_size_and_resume(
    job: dict[str, Any],
) -> None:
    steps = 14
    whole = laid_out(recipe_loaders(job, 1, False), job, steps)
    first = recipe_loaders(job, job["world"], False)
    before = laid_out(first, job, job["crash"])
    state = json.loads(json.dumps(first[0].state_dict()))
    resumed = recipe_loaders(job, job["world2"], True)
    for dl in resumed:
        dl.load_state_dict(state)
    run = before + laid_out(resumed, job, steps - job["crash"])
    assert [sorted(i for b in s for i in b) for s in run] == [sorted(s[0]) for s in whole]
    phases, g = phases_of(job), job["g"]
    counts: Counter[int] = Counter()
    supplied: dict[int, list[int]] = {k: [] for k in range(len(job["sources"]))}
    for t, step in enumerate(run):
        start, weights = [p for p in phases if p[0] <= t][-1]
        if start == t:
            counts.clear()
        shares = [Fraction(w, sum(weights)) for w in weights]
        for batch in step:  # every rank within 2 rows of its share of each dataset
            for k, share in enumerate(shares):
                assert abs(sum(1 for i in batch if i // BASE == k) - len(batch) * share) < 2
        layout = [i for batch in step for i in batch]  # ranks in order: the step's layout
        counts.update(i // BASE for i in layout)
        for k, share in enumerate(shares):  # exact within the phase
            assert abs(counts[k] - (t - start + 1) * g * share) < 1
        for i in layout:
            supplied[i // BASE].append(i)
    for k, (rows, splits) in enumerate(job["sources"]):  # every row of a pass once
        length = splits * (rows // splits)
        ids = supplied[k]
        for a in range(0, len(ids), length):
            assert len(set(ids[a : a + length])) == len(ids[a : a + length])
