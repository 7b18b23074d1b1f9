"""A mixture's weights as exact integer shares, and their phases over global steps.

Weights change only at a global step boundary: a phase is (the global step it starts at,
its weights), and the row sequence of `loader.kernels.mix` starts afresh at every phase, so
within a phase the counts are exact (after i rows source k has supplied floor(i*w_k) or
ceil(i*w_k)). A schedule is a list of phases; `linear_ramp` writes a linear change of weights
as one. Standard library and NumPy only: the plan, the state checks and the tools share it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import args
from loader.kernels.mix import PERIOD_LIMIT, _mix_counts, _mix_labels

FLOAT_DENOMINATOR = 10**6  # a float weight is read as the nearest fraction this fine


@dataclass(frozen=True)
class Weights:
    """Shares as integers: source k supplies `shares[k] / period` of every phase's rows."""

    shares: tuple[int, ...]
    period: int

    @classmethod
    def of(cls, weights: Sequence[Any], count: int, name: str = "weights") -> Weights:
        """Exact shares from ints, Fractions or floats (NumPy's too; a float is the nearest
        fraction with a denominator up to 10**6: 0.7 -> 7/10, 1/3 -> 1/3)."""
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence | np.ndarray):
            raise TypeError(f"{name} must be a list of numbers, got {type(weights).__name__}")
        if len(weights) != count:
            raise ValueError(f"{name} has {len(weights)} entries for {count} datasets: one each")
        fractions = [_fraction(w, f"{name}[{k}]") for k, w in enumerate(weights)]
        if sum(fractions) <= 0:
            raise ValueError(f"{name} are all 0: at least one dataset must have a weight > 0")
        scale = math.lcm(*(f.denominator for f in fractions))
        ints = [int(f * scale) for f in fractions]
        common = math.gcd(*ints)
        shares = tuple(i // common for i in ints)
        if sum(shares) > PERIOD_LIMIT:
            raise ValueError(
                f"{name}={list(weights)} reduce to shares {list(shares)} whose sum exceeds "
                f"2**31; give them as small integers (e.g. [7, 2, 1]) or simpler fractions"
            )
        return cls(shares, sum(shares))

    def fractions(self) -> list[Fraction]:
        return [Fraction(s, self.period) for s in self.shares]

    def text(self) -> list[str]:
        """The shares as reduced fractions ("7/10"), what the state saves."""
        return [str(f) for f in self.fractions()]

    @functools.cached_property
    def _array(self) -> NDArray[np.int64]:
        return np.asarray(self.shares, dtype=np.int64)

    def counts_after(self, counts: tuple[int, ...], rows: int) -> tuple[int, ...]:
        out = _mix_counts(self._array, self.period, np.asarray(counts, dtype=np.int64), rows)
        return tuple(out.tolist())

    def labels(self, counts: tuple[int, ...], rows: int) -> NDArray[np.int64]:
        """The source of each of the next `rows` rows after `counts` (the row sequence)."""
        return _mix_labels(self._array, self.period, np.asarray(counts, dtype=np.int64), rows)

    def steps_to_supply(
        self, counts: tuple[int, ...], k: int, rows: int, g: int, limit: int | None
    ) -> int | None:
        """The fewest steps of G = `g` rows from `counts` after which source k has supplied
        `rows` more rows (None when more than `limit` steps)."""

        def enough(steps: int) -> bool:
            return self.counts_after(counts, steps * g)[k] - counts[k] >= rows

        if rows <= 0:
            return 0
        if limit is not None and not enough(limit):
            return None
        # every count is within one row of its share: the answer lies in a window of about
        # 2 / (G * share) + 1 steps, found from the shares alone; the kernel decides inside it
        share = Fraction(self.shares[k], self.period)
        done = sum(counts)
        target = rows + counts[k]  # the count source k must reach
        low = max(0, math.floor((target - 1 - done * share) / (share * g)))
        high = max(1, math.ceil((target + 1 - done * share) / (share * g)))
        if limit is not None:
            high = min(high, limit)
        while not enough(high):  # (never: the bound holds; kept as a guard)
            high *= 2
        low = min(low, high - 1)
        while low + 1 < high:
            mid = (low + high) // 2
            if enough(mid):
                high = mid
            else:
                low = mid
        return high


def by_size(sizes: list[int]) -> list[int]:
    """Weights in proportion to `sizes`, scaled to sum to at most 2**20 (a short period for
    the count kernel: exact up to a million rows, to about 1 part in a million beyond)."""
    scale = -(-sum(sizes) // 2**20)
    return [max(1, size // scale) if size else 0 for size in sizes]


def _fraction(value: Any, name: str) -> Fraction:
    return args.fraction(name, value, FLOAT_DENOMINATOR)  # the one checker (numpy numbers too)


def parse_weights(texts: Any, field: str = "weights") -> list[Fraction]:
    """A state's weights ("7/10" each), or ValueError naming the field."""
    try:
        return [Fraction(str(t)) for t in texts]
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(
            f"mixture state field {field!r} is {texts!r}: expected fractions"
        ) from None


@dataclass(frozen=True)
class Phase:
    """Weights in force from global step `start` until the next phase's start."""

    start: int
    weights: Weights

    def saved(self) -> list[Any]:
        """[start, ["7/10", ...]]: a phase in the state."""
        return [self.start, self.weights.text()]


Phases = tuple[Phase, ...]  # sorted by start, starts distinct


def phase_index(phases: Phases, step: int) -> int:
    """The index of the phase in force at global step `step` (the first one before any)."""
    index = 0
    for i, phase in enumerate(phases):
        if phase.start <= step:
            index = i
    return index


def with_phase(phases: Phases, phase: Phase, replace_later: bool) -> Phases:
    """`phases` with `phase` from its start on: a phase at that start is replaced, and with
    `replace_later` so are all later ones (the weights from that step on)."""
    kept = [p for p in phases if p.start < phase.start]
    later = [] if replace_later else [p for p in phases if p.start > phase.start]
    return (*kept, phase, *later)


def schedule_phases(schedule: Any, count: int) -> list[Phase]:
    """A user's `schedule=[(global_step, weights), ...]` as phases, checked: steps are
    integers >= 1 in increasing order (step 0 is `weights=`)."""
    if schedule is None:
        return []
    if isinstance(schedule, str | bytes) or not isinstance(schedule, Sequence):
        raise TypeError(
            f"schedule must be a list of (global_step, weights) pairs, got {type(schedule).__name__}"
        )
    out: list[Phase] = []
    for i, entry in enumerate(schedule):
        if not isinstance(entry, Sequence) or isinstance(entry, str | bytes) or len(entry) != 2:
            raise TypeError(f"schedule[{i}] must be a (global_step, weights) pair, got {entry!r}")
        step = args.step(f"schedule[{i}] global step", entry[0], 1)
        if out and step <= out[-1].start:
            raise ValueError(
                f"schedule[{i}] starts at global step {step}, not after schedule[{i - 1}]'s "
                f"{out[-1].start}: give the phases in increasing order of step"
            )
        out.append(Phase(step, Weights.of(entry[1], count, f"schedule[{i}] weights")))
    return out


def linear_ramp(
    start_step: int,
    end_step: int,
    from_weights: Sequence[Any],
    to_weights: Sequence[Any],
    phases: int | None = None,
) -> list[tuple[int, list[Fraction]]]:
    """A linear change of weights from `from_weights` at `start_step` to `to_weights` at
    `end_step`, as `phases` piecewise-constant phases (a `schedule=` for MixedDataset).

    Phase i (of N) starts at start_step + floor(i * (end_step - start_step) / N) with the
    weights interpolated at i / N (exact fractions of the normalised weights); the last
    phase, at end_step, holds `to_weights`. Each phase's counts are exact; the ramp is
    linear to within one phase. `phases` None: 10, or one a step when the ramp is shorter.
    A phase at step 0 is left out (that is `weights=`). Append more phases after it, or
    put phases before it.
    """
    start = args.step("start_step", start_step, 0)
    end = args.step("end_step", end_step, start + 1)
    span = end - start
    count = args.integer("phases", min(10, span) if phases is None else phases, 1, span + 1)
    if isinstance(from_weights, str | bytes) or not isinstance(from_weights, Sequence):
        raise TypeError(f"from_weights must be a list of numbers, got {from_weights!r}")
    a = Weights.of(from_weights, len(from_weights), "from_weights").fractions()
    b = Weights.of(to_weights, len(a), "to_weights").fractions()
    out = []
    for i in range(count + 1):
        at = Fraction(i, count)
        step = start + span * i // count
        out.append((step, [x + (y - x) * at for x, y in zip(a, b, strict=True)]))
    return [entry for entry in out if entry[0] > 0]


def saved_phases(entries: Any, count: int) -> Phases:
    """A state's `phases` ([[start, ["7/10", ...]], ...]) as phases, or ValueError."""
    out = []
    for i, entry in enumerate(entries):
        start, texts = entry
        out.append(Phase(int(start), Weights.of(parse_weights(texts), count, f"phases[{i}]")))
    return tuple(out)


def resumed_phases(
    saved: Phases, base: Weights | None, schedule: Sequence[Phase], at: int
) -> Phases:
    """The phases of a run resumed at global step `at` (saved: the state's; base: the
    mixture's `weights=`, None when not given; schedule: its `schedule=`).

    Phases before `at` happened and cannot change: a schedule entry before `at` must be one
    of them (else ValueError). The weights in force at `at` are the last schedule entry at
    or before it, else `weights=`, else the saved ones; the same as saved continues the
    saved phase (its counts), others begin a phase at `at`. Later phases are the schedule's
    (without `weights=` or `schedule=`: the saved ones)."""
    past = [p for p in saved if p.start < at]
    for i, phase in enumerate(schedule):
        if phase.start < at and phase not in past:
            was = next((p for p in past if p.start == phase.start), None)
            raise ValueError(
                f"schedule entry {i} (global step {phase.start}, weights "
                f"{phase.weights.text()}) rewrites a past phase: the run resumes at global "
                f"step {at}, and at step {phase.start} it "
                + (f"had weights {was.weights.text()}" if was else "began no phase")
                + "; change only phases at or after the resumed step"
            )
    if base is None and not schedule:
        return saved
    in_force = saved[phase_index(saved, at)]
    declared = [p for p in schedule if p.start <= at]
    weights = declared[-1].weights if declared else base if base is not None else in_force.weights
    now = [] if weights == in_force.weights else [Phase(at, weights)]
    if not now and in_force.start == at:
        now = [in_force]
        past = [p for p in past if p.start != at]
    return (*past, *now, *(p for p in schedule if p.start > at))
