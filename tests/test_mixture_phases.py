"""Weight phases of a mixture through the loader: a declared `schedule`, `linear_ramp`, online
`set_weights`, and what each means at a resume (in-memory Arrow tables; ranks simulated by
one loader per rank, as tests/test_mixture_properties.py does)."""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from loader import MixedDataset, StreamingDataLoader, StreamingDataset, linear_ramp

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BASE = 1000  # dataset k's ids are k * BASE + row
SIZES = [(60, 3), (45, 2), (23, 1)]  # (rows, num_splits) per dataset
G = 10
A, B = [6, 3, 1], [2, 5, 3]


def ranks(world: int, weights: Any = A, g: int = G, **kw: Any) -> list[StreamingDataLoader]:
    out = []
    for rank in range(world):
        datasets = [
            StreamingDataset(
                pa.table({"id": [k * BASE + i for i in range(rows)]}),
                num_splits=splits,
                shuffle_seed=k,
                rank=rank,
                world_size=world,
            )
            for k, (rows, splits) in enumerate(SIZES)
        ]
        mix = MixedDataset(datasets, weights, **kw)
        out.append(StreamingDataLoader(mix, global_batch_size=g, reads_in_flight=0, read_size=1))
    return out


def run(
    dls: list[StreamingDataLoader], count: int, calls: Any = None, epochs: Any = None
) -> list[list[list[int]]]:
    """`count` global steps (across epochs): every rank's batch of ids; `calls` maps a
    global step to set_weights arguments, made on every rank before that step is read.
    Every rank's `for` ends at the same step, never without a batch; `epochs` (a list)
    gets the steps of each epoch (the last one as far as it was read)."""
    out: list[list[list[int]]] = []
    while len(out) < count:
        its, length = [iter(dl) for dl in dls], 0
        while len(out) < count:
            for dl in dls:
                if calls and dl.global_step in calls:
                    dl.set_weights(*calls[dl.global_step])
            batches = [next(it, None) for it in its]
            if all(b is None for b in batches):
                break
            assert None not in batches, f"the ranks' epochs end apart at step {len(out)}"
            out.append([b["id"].tolist() for b in batches if b is not None])
            length += 1
        assert length > 0, f"an epoch without a batch at global step {len(out)}"
        if epochs is not None:
            epochs.append(length)
    return out


def union(steps: list[list[list[int]]]) -> list[list[int]]:
    return [sorted(i for batch in step for i in batch) for step in steps]


def exact(steps: list[list[list[int]]], weights: list[int], g: int = G) -> None:
    """Counts exact over the steps (one phase), and every rank within 2 rows of its share."""
    shares = [Fraction(w, sum(weights)) for w in weights]
    total: Counter[int] = Counter()
    for t, step in enumerate(steps, 1):
        for batch in step:
            here = Counter(i // BASE for i in batch)
            total.update(here)
            for k, share in enumerate(shares):
                assert abs(here[k] - len(batch) * share) < 2
        for k, share in enumerate(shares):
            assert abs(total[k] - t * g * share) < 1


def test_a_schedule_holds_exact_counts_per_phase_on_every_world_size() -> None:
    schedule = [(4, B), (9, [1, 1, 1])]
    whole = run(ranks(1, schedule=schedule), 14)
    for world in (2, 3, 7):
        assert union(run(ranks(world, schedule=schedule), 14)) == union(whole)
    per_rank = run(ranks(3, schedule=schedule), 14)
    exact(per_rank[:4], A)
    exact(per_rank[4:9], B)
    exact(per_rank[9:], [1, 1, 1])
    assert union(run(ranks(1), 4)) == union(whole[:4])  # before the first scheduled step


def test_a_resume_continues_a_schedule_on_another_world_size() -> None:
    schedule = [(5, B)]
    whole = union(run(ranks(2, schedule=schedule), 12))
    for crash in (3, 5, 8):
        first = ranks(2, schedule=schedule)
        assert union(run(first, crash)) == whole[:crash]
        state = json.loads(json.dumps(first[0].state_dict()))
        assert state["phases"] == [[0, ["3/5", "3/10", "1/10"]], [5, ["1/5", "1/2", "3/10"]]]
        for kw in ({"schedule": schedule}, {"weights": None}):  # None: the saved phases
            resumed = ranks(3, **({"weights": A} | kw))
            for dl in resumed:
                dl.load_state_dict(state)
            assert union(run(resumed, 12 - crash)) == whole[crash:]


def test_a_resume_replaces_future_phases_and_refuses_to_rewrite_past_ones() -> None:
    first = ranks(1, schedule=[(3, B), (8, A)])
    run(first, 5)
    state = first[0].state_dict()
    later = ranks(2, schedule=[(3, B), (6, [1, 1, 1])])  # the phase at 8 replaced
    for dl in later:
        dl.load_state_dict(state)
    steps = run(later, 6)
    exact(steps[1:], [1, 1, 1])  # from step 6 on
    assert later[0].state_dict()["phases"][1:] == [[3, ["1/5", "1/2", "3/10"]], [6, ["1/3"] * 3]]
    for schedule, step in (([(2, B)], 2), ([(3, [1, 1, 1])], 3), ([(4, B)], 4)):
        with pytest.raises(ValueError, match=f"schedule entry 0 \\(global step {step}.*past"):
            ranks(1, schedule=schedule)[0].load_state_dict(state)


def test_new_weights_at_a_resume_start_a_phase_the_same_ones_continue() -> None:
    whole = union(run(ranks(1), 9))
    first = ranks(2)
    run(first, 4)
    state = first[0].state_dict()
    same = ranks(3, weights=[Fraction(3, 5), 0.3, 0.1])  # the weights in force, spelled otherwise
    for dl in same:
        dl.load_state_dict(state)
    assert union(run(same, 5)) == whole[4:]
    other = ranks(3, weights=B)
    for dl in other:
        dl.load_state_dict(state)
    exact(run(other, 5), B)
    assert other[0].state_dict()["phases"] == [
        [0, ["3/5", "3/10", "1/10"]],
        [4, ["1/5", "1/2", "3/10"]],
    ]


def test_linear_ramp_writes_phases() -> None:
    ramp = linear_ramp(10, 20, [1, 0], [0, 1], phases=4)
    assert ramp == [
        (10, [1, 0]),
        (12, [Fraction(3, 4), Fraction(1, 4)]),
        (15, [Fraction(1, 2), Fraction(1, 2)]),
        (17, [Fraction(1, 4), Fraction(3, 4)]),
        (20, [0, 1]),
    ]
    assert linear_ramp(0, 3, [1, 1], [1, 3], phases=3)[0][0] == 1  # step 0 is weights=
    assert len(linear_ramp(0, 4, [1, 1], [1, 3])) == 4 and len(linear_ramp(0, 99, A, B)) == 10
    dls = ranks(2, schedule=linear_ramp(2, 8, A, B, phases=3))
    steps = run(dls, 10)
    exact(steps[2:4], A)
    exact(steps[4:6], [14, 11, 5])  # a third of the way: 6:3:1 + (2:5:3 - 6:3:1) / 3
    exact(steps[6:8], [10, 13, 7])
    exact(steps[8:], B)
    for bad, match in (
        ({"phases": 0}, "phases"),
        ({"end_step": 2}, "end_step"),
        ({"to_weights": [1, 2]}, "to_weights"),
    ):
        args = {"start_step": 2, "end_step": 8, "from_weights": A, "to_weights": B, "phases": 3}
        args |= bad
        with pytest.raises(ValueError, match=match):
            linear_ramp(**args)


def test_bad_schedules_say_what_to_fix() -> None:
    for schedule, error, match in (
        ([(0, B)], ValueError, "schedule\\[0\\] global step"),
        ([(5, B), (5, A)], ValueError, "increasing"),
        ([(5, [1, 2])], ValueError, "schedule\\[0\\] weights has 2 entries"),
        ([5], TypeError, "pair"),
        ("x", TypeError, "schedule must be a list"),
    ):
        with pytest.raises(error, match=match):
            ranks(1, schedule=schedule)


def test_set_weights_equals_the_same_schedule_and_resumes_on_any_world_size() -> None:
    scheduled = union(run(ranks(1, schedule=[(4, B)]), 12))
    online = ranks(2)
    assert union(run(online, 12, calls={2: (B, 4)})) == scheduled
    first = ranks(2)
    steps = run(first, 6, calls={1: (B, 4)})
    assert union(steps) == scheduled[:6]
    state = json.loads(json.dumps(first[0].state_dict()))
    assert state["phases"][-1] == [4, ["1/5", "1/2", "3/10"]]
    for weights in (None, B):  # the weights in force, or None: the phase continues exactly
        resumed = ranks(3, weights=weights)
        for dl in resumed:
            dl.load_state_dict(state)
        calls = {6: (B, 4)}  # calling it again after the resume changes nothing
        assert union(run(resumed, 6, calls=calls)) == scheduled[6:]


def test_each_phase_decides_which_passes_end_its_epochs() -> None:
    """The dataset that ends epochs (here the third, the longest pass at A) drops to weight
    0: from that phase on the first pass any dataset completes ends the epoch; the epoch
    ended before the phase stays where it was, and a schedule entry, set_weights called
    ahead and set_weights called at the step give the same epochs on every W."""
    drop = [6, 4, 0]
    alone: list[int] = []
    run(ranks(1), 30, epochs=alone)
    assert alone[0] == 23  # 230 rows of pass per unit of the third's share of 10-row steps
    found = []
    for world, kw, calls in (
        (1, {"schedule": [(26, drop)]}, None),
        (3, {"schedule": [(26, drop)]}, None),
        (2, {}, {20: (drop, 26)}),
        (3, {}, {26: (drop, 26)}),
    ):
        epochs: list[int] = []
        steps = union(run(ranks(world, **kw), 60, calls=calls, epochs=epochs))
        found.append((steps, epochs))
        assert epochs[0] == 23
    assert all(f == found[0] for f in found)
    epochs = found[0][1]
    # from step 26 any pass ends the epoch: the second dataset's (12 rows left at 4 a step)
    # in step 28, then the first's (6 rows left) in step 29
    assert epochs[1:3] == [28 - 23 + 1, 1]
    first = ranks(2)
    run(first, 31)  # the first dataset completed a pass in step 29, the epoch goes on
    state = first[0].state_dict()
    resumed = ranks(3, weights=drop)  # new weights at the resume: a phase from step 31
    for dl in resumed:
        dl.load_state_dict(state)
    epochs = []
    run(resumed, 3, epochs=epochs)
    assert epochs[0] == 1  # the epoch ends with the phase's first step, not before it


def test_set_weights_refuses_a_past_or_read_ahead_step_and_bad_input() -> None:
    dl = ranks(1)[0]
    it = iter(dl)
    next(it)
    next(it)
    with pytest.raises(ValueError, match=r"at_step=1.*at or after"):
        dl.set_weights(B, at_step=1)
    ahead = StreamingDataLoader(ranks(1)[0].streaming_dataset, global_batch_size=G)
    it = iter(ahead)  # reads_in_flight: the read-ahead threads take the next steps early
    next(it)
    reached = ahead.streaming_dataset.progress.read_ahead_to()
    assert reached > ahead.global_step + 1
    with pytest.raises(ValueError, match=f"at least {reached}"):
        ahead.set_weights(B, at_step=ahead.global_step + 1)
    ahead.set_weights(B, at_step=reached)  # beyond the read-ahead: taken
    with pytest.raises(ValueError, match="one each"):
        dl.set_weights([1, 2], at_step=10)
    with pytest.raises(TypeError, match="at_step"):
        dl.set_weights(B, at_step=2.5)
    single = StreamingDataLoader(StreamingDataset(pa.table({"id": [1, 2]}), num_splits=1))
    with pytest.raises(TypeError, match="MixedDataset"):
        single.set_weights(B, at_step=3)


def test_set_weights_for_a_step_a_skip_jumped_past_says_it_is_behind() -> None:
    """Found by tests/test_joints.py (rows, mixture of 3, set_weights, skip_steps): a range
    skipped over at_step made the refusal speak of steps "read ahead" that were handed out
    (skipped) already, with no read ahead at all. It now says the step is behind."""
    dl = ranks(1)[0]
    dl.skip_steps(1, 4)
    it = iter(dl)
    next(it)
    next(it)  # global steps 0 and 4
    assert dl.global_step == 5
    with pytest.raises(ValueError, match=r"at_step=2\) is behind the position \(global_step=5\)"):
        dl.set_weights(B, at_step=2)


def test_weights_none_at_a_resume_adopts_a_saved_weight_of_zero() -> None:
    """Issue 24 item 11: `weights=None` adopts the saved weights, a 0 among them (the saved
    epoch rule with them: by size, the first dataset's pass would end the epoch)."""
    whole = union(run(ranks(1, weights=[0, 1, 1]), 9))
    first = ranks(2, weights=[0, 1, 1])
    run(first, 4)
    state = first[0].state_dict()
    resumed = ranks(3, weights=None)
    for dl in resumed:
        dl.load_state_dict(state)
    assert len(resumed[0]) == len(first[0])
    assert union(run(resumed, 5)) == whole[4:]


def test_inspect_lists_the_phases(tmp_path: Any) -> None:
    from loader import checkpoint
    from loader.tools.inspect import format_inspect

    dls = ranks(1, schedule=[(3, B)])
    run(dls, 2)
    text = format_inspect(checkpoint.save(dls[0].state_dict(), tmp_path / "mix.json"))
    assert "phases      step 0: 3/5, 3/10, 1/10; step 3: 1/5, 1/2, 3/10" in text


def test_a_state_saved_before_interleaving_loads_and_its_steps_hold_the_same_rows() -> None:
    """tests/fixtures/mixture_before_interleaving.json: a state the dataset-by-dataset code
    (9c6624e) saved after 7 steps of 6:3:1 on W = 2 (seed=5), and the rows of its next 12
    global steps there. Loaded here (no `phases` key: one phase) on W = 3 and with
    weights=None, the steps hold the same rows; only their places in a step moved."""
    saved = json.loads((FIXTURES / "mixture_before_interleaving.json").read_text())
    assert "phases" not in saved["state"]
    for kw in ({"weights": A, "seed": 5}, {"weights": None}):
        resumed = ranks(3, **kw)
        for dl in resumed:
            dl.load_state_dict(saved["state"])
        steps = run(resumed, 12)
        assert union(steps) == saved["next_steps"]
        exact(steps, A)  # the saved phase goes on: every rank mixed from here on


def test_the_weights_in_force_and_the_telemetry_layout() -> None:
    """`weights` and the `mixture` event's facts follow the phase of the next step; the
    event's layout is the interleaved step's runs, left out beyond STEP_RUNS_SHOWN runs."""
    from loader.mixture.dataset import STEP_RUNS_SHOWN, layout_runs

    dl = ranks(1, schedule=[(2, B)])[0]
    mix = dl.streaming_dataset
    assert mix.weights == [0.6, 0.3, 0.1]
    run([dl], 2)
    assert mix.weights == [0.2, 0.5, 0.3]
    facts = mix.facts(G)
    assert facts["weights"] == ["1/5", "1/2", "3/10"] and facts["phase_start"] == 2
    flat = facts["step_segments"]
    assert sum(flat[2::3]) == G and flat[1::3] == sorted(flat[1::3])
    assert [
        k for k, _, n in zip(flat[0::3], flat[1::3], flat[2::3], strict=True) for _ in range(n)
    ] == (mix.mix_plan.layout(mix.progress.mix_position(), G, 0, G).tolist())
    assert len(layout_runs(np.arange(STEP_RUNS_SHOWN) % 2) or []) == 3 * STEP_RUNS_SHOWN
    assert layout_runs(np.arange(STEP_RUNS_SHOWN + 1) % 2) is None
    assert mix.phases == [
        (0, [Fraction(3, 5), Fraction(3, 10), Fraction(1, 10)]),
        (2, [Fraction(1, 5), Fraction(1, 2), Fraction(3, 10)]),
    ]
