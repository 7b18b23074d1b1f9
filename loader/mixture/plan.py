"""A mixture's plan: which rows of which source every global step holds, from a position alone.

Pure arithmetic, no I/O (what the property tests and the rows ledger drive). Weights come in
phases (`loader.mixture.weights`): the phase in force at global step t is the last one
starting at or before t, and its row sequence (`loader.kernels.mix`) starts afresh at the
phase's start. Global step t of G rows is the next G rows of that sequence: row j of the step
goes to the source the sequence names (the step's *layout*, interleaved), so after T steps of
a phase source k has supplied within one row of T*G*w_k, and any slice [lo, hi) of a step
holds each source within two rows of (hi - lo)*w_k. Source k's rows of the step are its own
next n_k rows (its all-splits stream: the split with the smallest cursor first, laid out
split-major), placed in the order the layout names k; a source that runs out continues into
its next pass (its plan's next epoch) inside the same step, and a pass with no rows (a
small packed dataset's pass may hold no whole block) is passed over and counted. Rank r
takes positions [r*G//W, (r+1)*G//W) of the layout, as for a single dataset: global step t
is the same rows on every W <= G, and each rank's batch is G//W rows or one more.

What to call to answer "which rows did global step t hold" (the rows ledger):

- `MixPlan.step(pos, G)` -> (position after the step, its `Segment`s): per source and
  pass, the levels [before[s], after[s]) of each split, and `first`/`count`, the source's
  rows of the step they are (source by source, passes in order); a segment with
  `passes` > 1 is that many whole passes of a small dataset, from `epoch` on;
- `MixPlan.layout(pos, G, lo, hi)`: the source of each position [lo, hi) of the step's
  layout (int64); `MixPlan.rank_step(pos, G, lo, hi)` -> (position after, a rank's
  `Piece`s, its layout): what one rank reads, as the loader reads it;
- `rank_pieces(segments, firsts, stops)`: a rank's part of each segment from the source
  rows [firsts[k], stops[k]) it holds (`MixPlan.rank_rows`).

Walk from a saved position (`MixPosition`, from a state) with `step` to reach step t; the
phases are the plan's (`MixPlan.phases`, saved in the state as `phases`). Every function is
pure: the same arguments give the same answer on every machine, W and worker count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader.kernels.stream import _advance, _slice_runs
from loader.mixture.weights import (
    FLOAT_DENOMINATOR,
    Phase,
    Phases,
    Weights,
    parse_weights,
    phase_index,
)

__all__ = [
    "FLOAT_DENOMINATOR",
    "MixPlan",
    "MixPosition",
    "Phase",
    "Piece",
    "Segment",
    "SourceAt",
    "Weights",
    "parse_weights",
    "rank_pieces",
]

FIRST_PASS = "first_pass"  # the epoch ends with the step in which a source completes a pass
ALL_PASSES = "all_passes"  # ... in which the last source completes one
PASS_OF = "pass_of:"  # "pass_of:K": ... in which source K completes one
EMPTY_PASSES_LIMIT = 1000  # consecutive passes without a row: the dataset holds none


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
    empty_passes: tuple[int, ...] = ()  # passes per source that held no row (passed over)

    @classmethod
    def start(cls, sources: Sequence[SourceAt]) -> MixPosition:
        zeros = (0,) * len(sources)
        return cls(0, 0, 0, 0, zeros, tuple(sources), tuple(s.epoch for s in sources), zeros, zeros)


@dataclass(frozen=True)
class Segment:
    """Rows of one source's pass in a step: levels [before[s], after[s]) of each split, the
    source's rows [first, first + count) of the step (in the order its rows are laid out).
    `passes` > 1: that many whole passes from `epoch` on (before 0, after the pass length),
    each in its own epoch's order: a small dataset repeating many times inside a step is one
    segment, not one per pass."""

    source: int
    epoch: int
    before: NDArray[np.int64]
    after: NDArray[np.int64]
    first: int
    count: int
    passes: int = 1


@dataclass(frozen=True)
class Piece:
    """A rank's rows of one segment: runs (split, first level, stop level) of a pass; with
    `passes` > 1 the runs of one whole pass, read in each of `passes` epochs from `epoch`."""

    source: int
    epoch: int
    runs: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]  # splits, starts, stops
    count: int
    passes: int = 1


@dataclass(frozen=True)
class MixPlan:
    """What fixes a mixture's steps besides the position: the weight phases, each source's
    splits and units per split in each pass, and where epochs end. `phases` may be given as
    one `Weights` (one phase from step 0). `seed` is kept for the state (it once ordered the
    datasets of a step; the layout is now the row sequence's)."""

    phases: Phases  # (one `Weights` is taken as one phase from step 0)
    num_splits: tuple[int, ...]
    units: Callable[[int, int], int]  # (source, pass) -> units per split of that pass
    seed: int | None = None
    epoch_rule: str | int = FIRST_PASS  # FIRST_PASS, ALL_PASSES, pass_of(k) or a number of steps
    fixed: tuple[bool, ...] = ()  # sources whose passes all hold the same units (rows)
    _phases: Phases = field(init=False, repr=False, compare=False)
    _endings: tuple[tuple[tuple[int, ...], bool], ...] = field(
        init=False, repr=False, compare=False
    )  # per phase: `_ending`'s answer

    def __post_init__(self) -> None:
        phases: Any = self.phases
        if isinstance(phases, Weights):
            phases = (Phase(0, phases),)
        object.__setattr__(self, "phases", tuple(phases))
        object.__setattr__(self, "_phases", tuple(phases))
        object.__setattr__(self, "_endings", tuple(self._ending(p.weights) for p in phases))

    def phase_at(self, global_step: int) -> Phase:
        if len(self._phases) == 1:
            return self._phases[0]
        return self._phases[phase_index(self._phases, global_step)]

    def weights_at(self, global_step: int) -> Weights:
        return self.phase_at(global_step).weights

    def entering(self, pos: MixPosition) -> MixPosition:
        """`pos` with the phase of its next step: counts from zero when that step begins a
        phase (a schedule's, set_weights', or a resume's new weights)."""
        start = self.phase_at(pos.global_step).start
        if start == pos.phase_start or start > pos.global_step:
            return pos
        return replace(pos, phase_start=start, counts=(0,) * len(pos.counts))

    def left_in_pass(self, k: int, at: SourceAt) -> int:
        return self.num_splits[k] * self.units(k, at.epoch) - sum(at.cursors)

    def rank_rows(
        self, pos: MixPosition, global_batch: int, lo: int, hi: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(firsts, stops): per source, its rows [firsts[k], stops[k]) of the step from `pos`
        that positions [lo, hi) of the layout hold."""
        pos = self.entering(pos)
        weights = self.weights_at(pos.global_step)
        a, b = weights.counts_after(pos.counts, lo), weights.counts_after(pos.counts, hi)
        return _minus(a, pos.counts), _minus(b, pos.counts)

    def layout(self, pos: MixPosition, global_batch: int, lo: int, hi: int) -> NDArray[np.int64]:
        """The source of each position [lo, hi) of the step from `pos` (int64, hi - lo)."""
        pos = self.entering(pos)
        weights = self.weights_at(pos.global_step)
        return weights.labels(weights.counts_after(pos.counts, lo), hi - lo)

    def rank_step(
        self, pos: MixPosition, global_batch: int, lo: int, hi: int
    ) -> tuple[MixPosition, list[Piece], NDArray[np.int64]]:
        """One rank's part [lo, hi) of the step from `pos`: the position after the step,
        the rank's pieces (per source and pass, in source order) and its layout (what
        `step`, `rank_rows` and `layout` say, with fewer kernel calls: the loader's path)."""
        pos = self.entering(pos)
        weights = self.weights_at(pos.global_step)
        counts = weights.counts_after(pos.counts, global_batch)
        at_lo = pos.counts if lo == 0 else weights.counts_after(pos.counts, lo)
        at_hi = counts if hi == global_batch else weights.counts_after(pos.counts, hi)
        after, segments = self._take(pos, counts)
        pieces = rank_pieces(segments, _minus(at_lo, pos.counts), _minus(at_hi, pos.counts))
        return after, pieces, weights.labels(at_lo, hi - lo)

    def step(self, pos: MixPosition, global_batch: int) -> tuple[MixPosition, list[Segment]]:
        """The next global step: its segments (source by source, passes in order) and the
        position after it."""
        pos = self.entering(pos)
        return self._take(
            pos, self.weights_at(pos.global_step).counts_after(pos.counts, global_batch)
        )

    def _take(self, pos: MixPosition, counts: tuple[int, ...]) -> tuple[MixPosition, list[Segment]]:
        """The step from `pos` (in its phase) that brings the phase's counts to `counts`."""
        segments: list[Segment] = []
        sources = list(pos.sources)
        empty = list(pos.empty_passes or (0,) * len(sources))
        for k in range(len(sources)):
            want, first = counts[k] - pos.counts[k], 0
            skipped = 0
            while want > 0:
                at = sources[k]
                length = self.units(k, at.epoch)
                left = self.num_splits[k] * length - sum(at.cursors)  # left_in_pass
                if left <= 0:  # a pass without a row: it contributes nothing, counted
                    skipped += 1
                    if skipped > EMPTY_PASSES_LIMIT:
                        raise ValueError(
                            f"dataset {k} has no rows in passes {at.epoch - skipped + 1} to "
                            f"{at.epoch}: it cannot supply its share"
                        )
                    empty[k] += 1
                    sources[k] = SourceAt(at.epoch + 1, (0,) * len(at.cursors))
                    continue
                skipped = 0
                take = min(want, left)
                before = np.asarray(at.cursors, dtype=np.int64)
                after = _advance(before, take, length)
                segments.append(Segment(k, at.epoch, before, after, first, take))
                first += take
                want -= take
                if take == left:  # the pass is done: the next one starts from zero cursors
                    sources[k] = SourceAt(at.epoch + 1, (0,) * len(at.cursors))
                else:
                    sources[k] = SourceAt(at.epoch, tuple(after.tolist()))
                whole = self._whole_passes(k, sources[k], want) if want > 0 else None
                if whole is not None:  # passes of a small dataset: one segment for all
                    segments.append(replace(whole, first=first))
                    first += whole.count
                    want -= whole.count
                    sources[k] = SourceAt(whole.epoch + whole.passes, sources[k].cursors)
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
            empty_passes=tuple(empty),
        )
        if self._epoch_done(after_pos):
            after_pos = replace(
                after_pos,
                epoch=pos.epoch + 1,
                step=0,
                epoch_passes=tuple(s.epoch for s in sources),
            )
        return after_pos, segments

    def _whole_passes(self, k: int, at: SourceAt, want: int) -> Segment | None:
        """Two or more whole passes of source k from `at` (at a pass start) within `want`
        rows, as one segment (`first` left 0); None otherwise. Only for sources whose
        passes all hold the same rows (`fixed`)."""
        if not (self.fixed and self.fixed[k]) or any(at.cursors):
            return None
        length = self.units(k, at.epoch)
        rows = self.num_splits[k] * length
        if rows <= 0 or want < 2 * rows:
            return None
        passes = want // rows
        zeros = np.zeros(self.num_splits[k], dtype=np.int64)
        return Segment(k, at.epoch, zeros, zeros + length, 0, passes * rows, passes)

    def _ending(self, weights: Weights) -> tuple[tuple[int, ...], bool]:
        """The sources whose passes end epochs during a phase of `weights`, and whether all of them
        must (else any). Decided from that phase's weights, so that a later phase (a
        schedule's, set_weights') never changes where an earlier epoch ended: a rule naming a
        source of weight 0 there becomes "the first pass any source completes"."""
        count = len(self.num_splits)
        shares = weights.shares
        source = rule_source(self.epoch_rule)
        if source is not None:
            return ((source,), False) if shares[source] > 0 else (tuple(range(count)), False)
        if self.epoch_rule == ALL_PASSES:
            return tuple(k for k in range(count) if shares[k] > 0), True
        return tuple(range(count)), False

    def _epoch_done(self, pos: MixPosition) -> bool:
        """Whether the step that brought the mixture to `pos` ended its epoch (by the rule
        of that step's phase)."""
        if isinstance(self.epoch_rule, int):
            return pos.step >= self.epoch_rule
        sources, every = self._endings[phase_index(self._phases, pos.global_step - 1)]
        done = [pos.sources[k].epoch > pos.epoch_passes[k] for k in sources]
        return all(done) if every else any(done)

    def steps_left(self, pos: MixPosition, global_batch: int) -> int:
        """Steps until the mixture epoch of `pos` ends: phase by phase, the first step after
        which that phase's rule holds (from the counts alone: O(K log T) kernel calls per
        phase, each O(min(rows, 2 * period)))."""
        if isinstance(self.epoch_rule, int):
            return max(0, self.epoch_rule - pos.step)
        completes: dict[int, int | None] = {}  # steps after which source k ends its pass

        def completed(k: int) -> int | None:
            if k not in completes:
                at = pos.sources[k]
                if at.epoch > pos.epoch_passes[k]:
                    completes[k] = 0
                else:  # an empty pass ends in the step in which the source next supplies a row
                    rows = self.left_in_pass(k, at) or 1
                    completes[k] = self.steps_to_supply(pos, k, rows, global_batch)
            return completes[k]

        index, begins = phase_index(self._phases, pos.global_step), 0
        while True:
            after = self._phases[index + 1].start if index + 1 < len(self._phases) else None
            stop = None if after is None else after - pos.global_step
            sources, every = self._endings[index]
            ends = [completed(k) for k in sources]
            known = [e for e in ends if e is not None]
            end = (
                (max(known) if len(known) == len(ends) else None)
                if every
                else min(known, default=None)
            )
            if end is not None:
                end = max(end, begins + 1)  # checked after the phase's own steps
                if stop is None or end <= stop:
                    return end
            if stop is None:
                raise ValueError(
                    f"epoch rule {self.epoch_rule!r}: no dataset ever completes a pass"
                )
            index, begins = index + 1, stop

    def steps_to_supply(self, pos: MixPosition, k: int, rows: int, global_batch: int) -> int | None:
        """The fewest steps after which source k has supplied `rows` more rows, phase by
        phase (None: never, its weight is 0 from some phase on)."""
        pos = self.entering(pos)
        counts, step, total = pos.counts, pos.global_step, 0
        index = phase_index(self._phases, step)
        while True:
            weights = self._phases[index].weights
            nxt = self._phases[index + 1].start if index + 1 < len(self._phases) else None
            limit = None if nxt is None else nxt - step
            if weights.shares[k] > 0:
                found = weights.steps_to_supply(counts, k, rows, global_batch, limit)
                if found is not None:
                    return total + found
            if limit is None:
                return None
            rows -= weights.counts_after(counts, limit * global_batch)[k] - counts[k]
            total, step, index = total + limit, step + limit, index + 1
            counts = (0,) * len(counts)


def _minus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def rank_pieces(
    segments: list[Segment], firsts: Sequence[int], stops: Sequence[int]
) -> list[Piece]:
    """A rank's part of each segment: of source k, its rows [firsts[k], stops[k]) of the
    step (empty pieces left out). Of a segment of whole passes: a piece of the first pass
    it enters part-way, one of the whole passes it holds, one of the pass it leaves early."""
    pieces = []
    for seg in segments:
        lo, hi = firsts[seg.source] - seg.first, stops[seg.source] - seg.first
        first, last = max(lo, 0), min(hi, seg.count)
        if first >= last:
            continue
        if seg.passes == 1:
            runs = _slice_runs(seg.before, seg.after, first, last)
            pieces.append(Piece(seg.source, seg.epoch, runs, last - first))
            continue
        rows = seg.count // seg.passes
        head, tail = -(-first // rows), last // rows  # the whole passes [head, tail)
        if head > tail:  # inside one pass
            pieces.append(_part(seg, head - 1, first % rows, last - (head - 1) * rows))
            continue
        if first < head * rows:
            pieces.append(_part(seg, head - 1, first % rows, rows))
        if tail > head:
            runs = _slice_runs(seg.before, seg.after, 0, rows)
            pieces.append(
                Piece(seg.source, seg.epoch + head, runs, (tail - head) * rows, tail - head)
            )
        if last > tail * rows:
            pieces.append(_part(seg, tail, 0, last - tail * rows))
    return pieces


def _part(seg: Segment, index: int, first: int, last: int) -> Piece:
    """Rows [first, last) of pass `index` of a segment of whole passes."""
    runs = _slice_runs(seg.before, seg.after, first, last)
    return Piece(seg.source, seg.epoch + index, runs, last - first)
