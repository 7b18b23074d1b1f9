"""A mixture's plan: which rows of which source every global step holds, from a position alone.

Pure arithmetic, no I/O (what the property tests drive). Global step t of G rows takes
n_k(t) rows from source k: the next G rows of the phase's exact row sequence
(`loader.kernels.mix`), so after T steps of a weight phase source k has supplied within one
row of T*G*w_k. Those rows are source k's own next n_k rows (its all-splits stream: the
split with the smallest cursor first), laid out split-major; a source that runs out
continues into its next pass (its plan's next epoch) inside the same step. The step's G rows
are laid out source by source (in a per-step order when a seed is given) and rank r takes
positions [r*G//W, (r+1)*G//W) of that layout, as a single dataset's step. So global step t
is the same rows on every W <= G, and each rank's batch is G//W rows or one more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import args
from loader.kernels.mix import PERIOD_LIMIT, _mix_counts
from loader.kernels.permute import mix64
from loader.kernels.stream import _advance, _slice_runs

FLOAT_DENOMINATOR = 10**6  # a float weight is read as the nearest fraction this fine
FIRST_PASS = "first_pass"  # the epoch ends with the step in which a source completes a pass
ALL_PASSES = "all_passes"  # ... in which the last source completes one
PASS_OF = "pass_of:"  # "pass_of:K": ... in which source K completes one


def pass_of(source: int) -> str:
    return f"{PASS_OF}{source}"


def longest_pass(pass_rows: Sequence[int], weights: Weights) -> int:
    """The source of weight > 0 whose pass takes the most steps (rows per unit of share);
    ties: the first. What ends a mixture's epoch by default."""
    active = [k for k, share in enumerate(weights.shares) if share]
    return max(active, key=lambda k: (Fraction(pass_rows[k], weights.shares[k]), -k))


def rule_source(rule: str | int) -> int | None:
    """K of a "pass_of:K" rule, else None."""
    if isinstance(rule, str) and rule.startswith(PASS_OF) and rule[len(PASS_OF) :].isdigit():
        return int(rule[len(PASS_OF) :])
    return None


@dataclass(frozen=True)
class Weights:
    """Shares as integers: source k supplies `shares[k] / period` of every phase's rows."""

    shares: tuple[int, ...]
    period: int

    @classmethod
    def of(cls, weights: Sequence[Any], count: int, name: str = "weights") -> Weights:
        """Exact shares from ints, Fractions or floats (a float is the nearest fraction with a
        denominator up to 10**6: 0.7 -> 7/10, 1/3 -> 1/3)."""
        if isinstance(weights, str | bytes) or not isinstance(weights, Sequence):
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
class SourceAt:
    """One source's place: its pass (its plan's epoch) and per-split cursors in units
    (rows, or packed blocks) of that pass."""

    epoch: int
    cursors: tuple[int, ...]


@dataclass(frozen=True)
class MixPosition:
    """Where a mixture is after the steps handed out; small and per source, never per rank."""

    epoch: int  # the mixture's
    step: int  # steps of that epoch done
    global_step: int  # steps since the run began
    phase_start: int  # the global step at which the current weights took effect
    counts: tuple[int, ...]  # rows per source since phase_start
    sources: tuple[SourceAt, ...]
    epoch_passes: tuple[int, ...]  # each source's pass when the mixture epoch began
    supplied: tuple[int, ...]  # units per source since the run began (for the dashboard)

    @classmethod
    def start(cls, sources: Sequence[SourceAt]) -> MixPosition:
        zeros = (0,) * len(sources)
        return cls(0, 0, 0, 0, zeros, tuple(sources), tuple(s.epoch for s in sources), zeros)


@dataclass(frozen=True)
class Segment:
    """Rows of one source's pass in a step: levels [before[s], after[s]) of each split,
    at positions [offset, offset + count) of the step's layout."""

    source: int
    epoch: int
    before: NDArray[np.int64]
    after: NDArray[np.int64]
    offset: int
    count: int


@dataclass(frozen=True)
class Piece:
    """A rank's rows of one segment: runs (split, first level, stop level) of a pass."""

    source: int
    epoch: int
    runs: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]  # splits, starts, stops
    count: int


@dataclass(frozen=True)
class MixPlan:
    """What fixes a mixture's steps besides the position: the weights, each source's splits
    and units per split in each pass, the per-step source order, and where epochs end."""

    weights: Weights
    num_splits: tuple[int, ...]
    units: Callable[[int, int], int]  # (source, pass) -> units per split of that pass
    seed: int | None = None
    epoch_rule: str | int = FIRST_PASS  # FIRST_PASS, ALL_PASSES, pass_of(k) or a number of steps

    def order(self, global_step: int) -> list[int]:
        """The order in which the sources' rows are laid out in a step: fixed, or a
        permutation per step from (seed, step) when a seed is given."""
        count = len(self.num_splits)
        if self.seed is None:
            return list(range(count))
        keys = [mix64(mix64(self.seed ^ mix64(global_step)) ^ k) for k in range(count)]
        return sorted(range(count), key=lambda k: (keys[k], k))

    def left_in_pass(self, k: int, at: SourceAt) -> int:
        return self.num_splits[k] * self.units(k, at.epoch) - sum(at.cursors)

    def step(self, pos: MixPosition, global_batch: int) -> tuple[MixPosition, list[Segment]]:
        """The next global step: its segments (in layout order) and the position after it."""
        counts = self.weights.counts_after(pos.counts, global_batch)
        segments: list[Segment] = []
        sources = list(pos.sources)
        offset = 0
        for k in self.order(pos.global_step):
            want = counts[k] - pos.counts[k]
            while want > 0:
                at = sources[k]
                length = self.units(k, at.epoch)
                left = self.left_in_pass(k, at)
                if left <= 0:
                    raise ValueError(f"dataset {k} has no rows in pass {at.epoch}")
                take = min(want, left)
                before = np.asarray(at.cursors, dtype=np.int64)
                after = _advance(before, take, length)
                segments.append(Segment(k, at.epoch, before, after, offset, take))
                offset += take
                want -= take
                if take == left:  # the pass is done: the next one starts from zero cursors
                    sources[k] = SourceAt(at.epoch + 1, (0,) * len(at.cursors))
                else:
                    sources[k] = SourceAt(at.epoch, tuple(after.tolist()))
        supplied = tuple(
            s + c - p for s, c, p in zip(pos.supplied, counts, pos.counts, strict=True)
        )
        after_pos = replace(
            pos,
            step=pos.step + 1,
            global_step=pos.global_step + 1,
            counts=counts,
            sources=tuple(sources),
            supplied=supplied,
        )
        if self._epoch_done(after_pos):
            after_pos = replace(
                after_pos,
                epoch=pos.epoch + 1,
                step=0,
                epoch_passes=tuple(s.epoch for s in sources),
            )
        return after_pos, segments

    def _active(self) -> list[int]:
        """The sources whose passes end epochs: those of weight > 0, or the rule's one."""
        source = rule_source(self.epoch_rule)
        if source is not None:
            return [source] if self.weights.shares[source] > 0 else []
        return [k for k, share in enumerate(self.weights.shares) if share > 0]

    def _epoch_done(self, pos: MixPosition) -> bool:
        if isinstance(self.epoch_rule, int):
            return pos.step >= self.epoch_rule
        done = [pos.sources[k].epoch > pos.epoch_passes[k] for k in self._active()]
        return any(done) if self.epoch_rule != ALL_PASSES else all(done)

    def steps_left(self, pos: MixPosition, global_batch: int) -> int:
        """Steps until the mixture epoch of `pos` ends (from the counts alone: O(K log T)
        kernel calls, each O(min(rows, 2 * period)))."""
        if isinstance(self.epoch_rule, int):
            return max(0, self.epoch_rule - pos.step)
        active = self._active()
        if not active:
            raise ValueError(f"epoch rule {self.epoch_rule!r} names a dataset of weight 0")
        ends = []
        for k in active:
            at = pos.sources[k]
            if at.epoch > pos.epoch_passes[k]:
                ends.append(0)
            else:
                ends.append(self.steps_to_supply(pos, k, self.left_in_pass(k, at), global_batch))
        return max(ends) if self.epoch_rule == ALL_PASSES else min(ends)

    def steps_to_supply(self, pos: MixPosition, k: int, rows: int, global_batch: int) -> int:
        """The fewest steps after which source k has supplied `rows` more rows."""

        def enough(steps: int) -> bool:
            counts = self.weights.counts_after(pos.counts, steps * global_batch)
            return counts[k] - pos.counts[k] >= rows

        # every count is within one row of its share: the answer lies in a window of about
        # 2 / (G * share) + 1 steps, found from the shares alone; the kernel decides inside it
        share = Fraction(self.weights.shares[k], self.weights.period)
        done = sum(pos.counts)
        target = rows + pos.counts[k]  # the count source k must reach
        low = max(0, math.floor((target - 1 - done * share) / (share * global_batch)))
        high = max(1, math.ceil((target + 1 - done * share) / (share * global_batch)))
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


def rank_pieces(segments: list[Segment], lo: int, hi: int) -> list[Piece]:
    """A rank's part [lo, hi) of a step's layout, segment by segment (empty ones left out)."""
    pieces = []
    for seg in segments:
        first, last = max(lo - seg.offset, 0), min(hi - seg.offset, seg.count)
        if first >= last:
            continue
        runs = _slice_runs(seg.before, seg.after, first, last)
        pieces.append(Piece(seg.source, seg.epoch, runs, last - first))
    return pieces
