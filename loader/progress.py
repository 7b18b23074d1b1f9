"""Where one rank is in the run: the single owner of epoch, cursors, stream and step.

The dataset owns one `Progress`; whatever iterates it (the dataset itself, row by row, or
a `StreamingDataLoader`, batch by batch) starts a stream here and records what reached the
training loop. So a second loader over the same dataset continues the same epoch with the
same step, and a state is built from one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loader import state as st
from loader.skips import SkipRanges
from loader.stream import ROWS, Batching, RankStream, rank_stream
from loader.world import World

__all__ = ["ROWS", "Batching", "Progress"]


class Progress:
    """Epoch, per-split cursors, the stream being handed out and the batches counted.

    - `start` begins a stream at the current position; `record` moves along it as batches
      reach the training loop. When a stream is done the position is the next epoch.
    - `load_state_dict` moves to a saved position; it takes effect when the next iteration
      starts (as torchdata's `next_yielded`): an iterator already running stops recording.
    - `step` counts the batches of the current epoch handed out (across `for` loops and
      resumes); `global_step` those since the run began (across epochs and resumes).
    """

    def __init__(
        self,
        world: World,
        num_splits: int,
        rows_per_split: int,
        epoch: int,
        units: Callable[[int], int] | None = None,
    ) -> None:
        self.world = world
        self.rows_per_split = rows_per_split
        # a split's length in an epoch when it is not L rows (packed blocks: per epoch)
        self._units = units
        self._epoch = epoch
        self._cursors: tuple[int, ...] = (0,) * num_splits
        self._stream: RankStream | None = None
        self._batches_done = 0  # of `_stream`: the contiguous prefix handed out
        self._ahead: set[int] = set()  # batches of `_stream` handed out past the prefix
        self._loaded_ahead: tuple[int, int, list[int]] | None = None  # (b, W, batches) of a state
        self.step = 0
        self.global_step = 0
        self.skips = SkipRanges()  # global steps [start, stop) to jump over
        self.steps_skipped: list[list[int]] = []  # [start, stop, units] jumped so far
        self.ran: tuple[int, Schedule] | None = None  # a loaded state's past batch sizes

    # -- the position -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch of the batch in hand (after an epoch's last batch, still that epoch)."""
        return self._epoch

    @property
    def cursors(self) -> tuple[int, ...]:
        """Per-split cursors of `epoch` after the batches handed out so far."""
        stream, done = self._stream, self._batches_done  # one read: telemetry's thread asks too
        if stream is None:
            return self._cursors
        return tuple(stream.cursors_after(done))

    @property
    def ended(self) -> bool:
        """Whether the batch in hand was its epoch's last (the next comes from epoch + 1)."""
        stream = self._stream
        return stream is not None and self._batches_done >= stream.num_batches

    def position(self) -> tuple[int, tuple[int, ...], int]:
        """Where the next batch comes from: (epoch, cursors, step of that epoch)."""
        if self.ended:
            return self._epoch + 1, (0,) * len(self._cursors), 0
        return self._epoch, self.cursors, self.step

    def _settle(self) -> None:
        if self._ahead:  # handed out past the prefix: kept for the next stream (same batching)
            assert self._stream is not None
            ahead = sorted(i - self._batches_done for i in self._ahead)
            self._loaded_ahead = (self._stream_batch_size(), self.world.world_size, ahead)
        self._move(*self.position())

    def _stream_batch_size(self) -> int:
        assert self._stream is not None
        return self._stream.cut

    def _move(self, epoch: int, cursors: tuple[int, ...], step: int) -> None:
        self._epoch, self._cursors, self.step = epoch, cursors, step
        self._stream, self._batches_done, self._ahead = None, 0, set()

    def _next_epoch(self) -> None:
        self._move(self._epoch + 1, (0,) * len(self._cursors), 0)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the position is already in it (then a
        running iteration carries on)."""
        if epoch != self.position()[0]:
            self._move(epoch, (0,) * len(self._cursors), 0)

    # -- streams ------------------------------------------------------------------------

    def peek(self, batching: Batching) -> RankStream:
        """The stream an iteration would start now, without starting it."""
        w = self.world
        epoch, cursors, _ = self.position()
        length = self._units(epoch) if self._units is not None else self.rows_per_split
        return rank_stream(epoch, cursors, length, w.rank, w.world_size, batching, self.global_step)

    def start(self, batching: Batching) -> RankStream:
        """The rest of this epoch from the current position; `record` then follows it."""
        self._settle()
        stream = self.peek(batching)
        self._stream = stream
        if self._loaded_ahead is not None:
            self._ahead = self._take_ahead(stream)
        if stream.num_batches == 0:  # nothing left on this world size: the epoch is over
            self._next_epoch()
        return stream

    def _take_ahead(self, stream: RankStream) -> set[int]:
        """The batches a state (or an earlier stream) handed out ahead of its prefix
        (`in_order=False`): this stream does not hand them out again."""
        assert self._loaded_ahead is not None
        size, world, ahead = self._loaded_ahead
        self._loaded_ahead = None
        now = stream.cut
        if (size, world) != (now, stream.world_size):
            raise ValueError(
                f"this position has {len(ahead)} batches handed out ahead of the others "
                f"(in_order=False) with a batch of {size} rows on world_size={world}; resume "
                f"it with the same batch size and world size (now {now} on {stream.world_size})"
            )
        return {i for i in ahead if i < stream.num_batches}

    def handed_out(self, index: int) -> bool:
        """Whether batch `index` of the current stream already reached the training loop."""
        return index < self._batches_done or index in self._ahead

    def untouched(self) -> bool:
        """Nothing started or handed out since the run began (the plan may still change)."""
        return self._stream is None and self.global_step == 0 and not any(self._cursors)

    def is_current(self, stream: RankStream) -> bool:
        return stream is self._stream

    def record(self, stream: RankStream, index: int | None = None) -> None:
        """Batch `index` (default: the next) of `stream` reached the training loop (a stale
        stream, replaced by a later `start` or a load, records nothing). Out of order
        (`in_order=False`), the position is the contiguous prefix plus the batches ahead.
        After the epoch's last batch the epoch stays the batch's; the position
        (`position()`, the state) is the next one."""
        if stream is not self._stream:
            return
        if index is None or index == self._batches_done:
            self._batches_done += 1
            while self._batches_done in self._ahead:
                self._ahead.discard(self._batches_done)
                self._batches_done += 1
        else:
            self._ahead.add(index)
        self.step += 1
        self.global_step += 1

    # -- skipping steps (Megatron's --skip-train-iteration-range) ------------------------

    def frontier(self) -> int:
        """The global step of the first batch not yet handed out (in order, `global_step`;
        with batches handed out ahead of it, `in_order=False`, `global_step` counts those)."""
        if self._ahead:
            return self.global_step - len(self._ahead)
        return self.global_step - (len(self._loaded_ahead[2]) if self._loaded_ahead else 0)

    def skip_due(self) -> bool:
        """Whether the first batch not yet handed out lies in a range to skip."""
        return self.skips.due(self.frontier()) is not None

    def issue_limit(self, stream: RankStream) -> int:
        """Batches of `stream` below the next range to skip: the loader reads no further, so
        out of order (`in_order=False`) no batch of a range is handed out before the jump."""
        if stream is not self._stream:
            return stream.num_batches
        start = self.skips.next_start(self.frontier())
        if start is None:
            return stream.num_batches
        first = self.global_step - self._batches_done - len(self._ahead)  # batch 0's step
        return max(0, min(stream.num_batches, start - first))

    def apply_skips(self, batching: Batching) -> None:
        """Jump over due steps: the position moves on by whole global steps (through the
        end of the epoch at most; the rest of a range is skipped when the next epoch
        starts), and the units jumped are recorded in the state. Batches of the range
        handed out before it was registered (ahead of the others, `in_order=False`) count
        as read, not skipped; those handed out past it stay handed out."""
        while (stop := self.skips.due(self.frontier())) is not None:
            first = self.frontier()
            self._settle()  # batches ahead of the prefix are now in `_loaded_ahead`
            stream = self.peek(batching)
            steps = min(stop - first, stream.num_batches)
            size, world, ahead = self._loaded_ahead or (0, 0, [])
            read = [i for i in ahead if i < steps]
            rest = [i - steps for i in ahead if i >= steps]
            after = tuple(stream.cursors_after(steps))
            units = sum(after) - sum(stream.start)
            units -= sum(_batch_units(stream, i) for i in read)
            self.steps_skipped.append([first, first + steps, units])
            self.global_step += steps - len(read)
            self._move(stream.epoch, after, self.step + steps - len(read))
            self._loaded_ahead = (size, world, rest) if rest else None
            if steps == stream.num_batches:
                self._next_epoch()
            if steps == 0:
                return  # an empty epoch: nothing to jump

    def batches(self, batching: Batching) -> int:
        """Batches of the position's epoch: those handed out plus those to come."""
        return self.position()[2] + self.peek(batching).num_batches

    # -- state --------------------------------------------------------------------------

    def state_dict(self, batching: Batching) -> dict[str, Any]:
        """The position part of the state (the dataset adds what identifies plan and source)."""
        epoch, cursors, step = self.position()
        ahead = {}
        if self._ahead and not self.ended:
            batches = sorted(i - self._batches_done for i in self._ahead)
            ahead = {st.KEY_AHEAD: {"batch_size": self._stream_batch_size(), "batches": batches}}
        elif self._loaded_ahead is not None and self._stream is None:  # loaded, or left by a skip
            size, _, batches = self._loaded_ahead
            ahead = {st.KEY_AHEAD: {"batch_size": size, "batches": list(batches)}}
        return {
            st.KEY_EPOCH: epoch,
            st.KEY_CURSORS: list(cursors),
            st.KEY_SKIPPED: self.peek(batching).skipped,
            st.KEY_WORLD_SIZE: self.world.world_size,
            st.KEY_STEP: step,
            st.KEY_GLOBAL_STEP: self.global_step,
            st.KEY_GLOBAL_BATCH: batching.rows_at(self.global_step, self.world.world_size),
            **({st.KEY_STEPS_SKIPPED: self.steps_skipped} if self.steps_skipped else {}),
            **schedule_state(batching, self.world.world_size, self.ran, len(self._cursors)),
            **(
                {st.KEY_SKIPS_PENDING: pending}
                if (pending := self.skips.pending(self.frontier()))
                else {}
            ),
            **ahead,
        }

    def load_state_dict(self, state: dict[str, Any], rows_per_split: int) -> None:
        """Move to a checked state's position (cursors already validated against the plan).

        A state whose every split is finished is the start of the next epoch. `step` counts
        on only inside the saved epoch. States written before `global_step` existed count
        from the saved step (earlier epochs are not known).
        """
        self.rows_per_split = rows_per_split
        self.ran = ran_schedule(state)
        epoch, cursors = int(state[st.KEY_EPOCH]), tuple(state[st.KEY_CURSORS])
        step = _count(state.get(st.KEY_STEP))
        self.global_step = _count(state.get(st.KEY_GLOBAL_STEP), default=step)
        self.steps_skipped = [list(r) for r in state.get(st.KEY_STEPS_SKIPPED, [])]
        for start, stop in state.get(st.KEY_SKIPS_PENDING, []):  # with those registered here
            self.skips.add(start, stop)
        saved = state.get(st.KEY_AHEAD)
        ahead = None
        if saved is not None:
            ahead = (saved["batch_size"], int(state[st.KEY_WORLD_SIZE]), list(saved["batches"]))
        self._loaded_ahead = None
        if all(c == rows_per_split for c in cursors):
            self._move(epoch, cursors, step)
            self._next_epoch()
        else:
            self._move(epoch, cursors, step if any(cursors) else 0)
            self._loaded_ahead = ahead


Schedule = tuple[tuple[int, int], ...]  # (global step, G): G from that step on, from 0


def ran_schedule(state: dict[str, Any]) -> tuple[int, Schedule] | None:
    """(a loaded state's global step, the G each step before it ran with), None for a
    state too old to say: a resume with another batch schedule keeps the past one."""
    saved, rows = state.get(st.KEY_BATCH_SCHEDULE), state.get(st.KEY_GLOBAL_BATCH)
    if saved:
        past = tuple((int(at), int(g)) for at, g in saved)
    elif rows is not None:
        past = ((0, int(rows)),)
    else:
        return None
    return _count(state.get(st.KEY_GLOBAL_STEP), default=_count(state.get(st.KEY_STEP))), past


def schedule_state(
    batching: Batching, world_size: int, ran: tuple[int, Schedule] | None = None, splits: int = 1
) -> dict[str, Any]:
    """The batch sizes the run's steps had, as the state keeps them: [[0, G0], [step, G],
    ...] (for the ledger and `inspect`; a resume takes the schedule its loader is given).
    `ran`: a loaded state's (global step, schedule): steps before it keep the G they ran
    with, so the ledger answers them with the rows that were read. No key when one G held."""
    now = [(0, batching.global_rows(world_size)), *batching.schedule]
    if ran is None:
        return {st.KEY_BATCH_SCHEDULE: [list(e) for e in now]} if batching.schedule else {}
    at, past = ran
    merged = [
        *(entry for entry in past if entry[0] < at),
        (at, batching.rows_at(at, world_size)),
        *(entry for entry in now if entry[0] > at),
    ]
    changes = [e for i, e in enumerate(merged) if i == 0 or e[1] != merged[i - 1][1]]
    if len(changes) == 1 and not batching.schedule:
        return {}
    if any(g % splits for _, g in changes):  # batch_size= rows a rank: no plan-wide G
        return {}
    return {st.KEY_BATCH_SCHEDULE: [list(entry) for entry in changes]}


def _batch_units(stream: RankStream, index: int) -> int:
    return sum(stream.cursors_after(index + 1)) - sum(stream.cursors_after(index))


def _count(value: Any, default: int = 0) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else default
