"""Where one rank is in the run: the single owner of epoch, cursors, stream and step.

The dataset owns one `Progress`; whatever iterates it (the dataset itself, row by row, or
a `StreamingDataLoader`, batch by batch) starts a stream here and records what reached the
training loop. So a second loader over the same dataset continues the same epoch with the
same step, and a state is built from one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loader import state as st
from loader.stream import RankStream
from loader.world import World


@dataclass(frozen=True)
class Batching:
    """How a stream is cut: `batch_size` rows a batch, `drop_last` the short final one."""

    batch_size: int
    drop_last: bool


ROWS = Batching(1, False)  # iterating the dataset itself: every row is a "batch" of one


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
        self._rows_done = 0  # of `_stream`
        self.step = 0
        self.global_step = 0

    # -- the position -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def cursors(self) -> tuple[int, ...]:
        """Per-split cursors after the rows handed out so far."""
        stream, done = self._stream, self._rows_done  # one read: telemetry's thread asks too
        if stream is None:
            return self._cursors
        return tuple(stream.cursors_at(done))

    def _settle(self) -> None:
        self._cursors, self._stream, self._rows_done = self.cursors, None, 0

    def _move(self, epoch: int, cursors: tuple[int, ...], step: int) -> None:
        self._epoch, self._cursors, self.step = epoch, cursors, step
        self._stream, self._rows_done = None, 0

    def _next_epoch(self) -> None:
        self._move(self._epoch + 1, (0,) * len(self._cursors), 0)

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the position is already in it (then a
        running iteration carries on)."""
        if epoch != self._epoch:
            self._move(epoch, (0,) * len(self._cursors), 0)

    # -- streams ------------------------------------------------------------------------

    def peek(self, batching: Batching) -> RankStream:
        """The stream an iteration would start now, without starting it."""
        w = self.world
        length = self._units(self._epoch) if self._units is not None else self.rows_per_split
        return RankStream(
            self._epoch,
            self.cursors,
            length,
            w.rank,
            w.world_size,
            batching.batch_size,
            batching.drop_last,
        )

    def start(self, batching: Batching) -> RankStream:
        """The rest of this epoch from the current position; `record` then follows it."""
        self._settle()
        stream = self.peek(batching)
        self._stream = stream
        if stream.rows == 0:  # nothing left on this world size: the epoch is over
            self._next_epoch()
        return stream

    def untouched(self) -> bool:
        """Nothing started or handed out since the run began (the plan may still change)."""
        return self._stream is None and self.global_step == 0 and not any(self._cursors)

    def is_current(self, stream: RankStream) -> bool:
        return stream is self._stream

    def record(self, rows: int, stream: RankStream) -> None:
        """A batch of `rows` rows of `stream` reached the training loop (a stale stream,
        replaced by a later `start` or a load, records nothing)."""
        if stream is not self._stream:
            return
        self._rows_done += rows
        self.step += 1
        self.global_step += 1
        if self._rows_done >= stream.rows:
            self._next_epoch()

    def batches(self, batching: Batching) -> int:
        """Batches of this epoch: those handed out plus those to come."""
        return self.step + self.peek(batching).num_batches

    # -- state --------------------------------------------------------------------------

    def state_dict(self, batching: Batching) -> dict[str, Any]:
        """The position part of the state (the dataset adds what identifies plan and source)."""
        return {
            st.KEY_EPOCH: self._epoch,
            st.KEY_CURSORS: list(self.cursors),
            st.KEY_SKIPPED: self.peek(batching).skipped,
            st.KEY_WORLD_SIZE: self.world.world_size,
            st.KEY_STEP: self.step,
            st.KEY_GLOBAL_STEP: self.global_step,
        }

    def load_state_dict(self, state: dict[str, Any], rows_per_split: int) -> None:
        """Move to a checked state's position (cursors already validated against the plan).

        A state whose every split is finished is the start of the next epoch. `step` counts
        on only inside the saved epoch. States written before `global_step` existed count
        from the saved step (earlier epochs are not known).
        """
        self.rows_per_split = rows_per_split
        epoch, cursors = int(state[st.KEY_EPOCH]), tuple(state[st.KEY_CURSORS])
        step = _count(state.get(st.KEY_STEP))
        self.global_step = _count(state.get(st.KEY_GLOBAL_STEP), default=step)
        if all(c == rows_per_split for c in cursors):
            self._move(epoch, cursors, step)
            self._next_epoch()
        else:
            self._move(epoch, cursors, step if any(cursors) else 0)


def _count(value: Any, default: int = 0) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else default
