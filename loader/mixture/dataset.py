"""MixedDataset: several StreamingDatasets read at set proportions, exactly resumable on any W.

Each dataset keeps its own source, filter, columns and plan; the mixture decides only how
many rows of each a global step holds (`loader.mixture.plan`) and goes into StreamingDataLoader
like a dataset. Batches carry a `source` tensor (the dataset's index in `names`, per row or
packed block). See docs/mixtures.md for the epoch, the state and changing weights at a resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader import args
from loader import state as st
from loader.dataset import StreamingDataset
from loader.mixture import reweight
from loader.mixture import state as ms
from loader.mixture.columns import check_columns
from loader.mixture.names import named_datasets
from loader.mixture.plan import (
    ALL_PASSES,
    FIRST_PASS,
    MixPlan,
    MixPosition,
    SourceAt,
    longest_pass,
    pass_of,
)
from loader.mixture.reader import SOURCE_FIELD, MixReader
from loader.mixture.stream import MixProgress
from loader.mixture.weights import (
    Phase,
    Weights,
    by_size,
    resumed_phases,
    saved_phases,
    schedule_phases,
)
from loader.plan import PlanSpec
from loader.progress import Batching, Schedule, ran_schedule, schedule_state
from loader.read.reader import BatchReader
from loader.sources import ResolvedSource, SourceSpec, is_remote
from loader.trainers.resharding import refuse_resharding
from loader.world import OnWorld, World

__all__ = ["SOURCE_FIELD", "CombinedStreamingDataset", "MixedDataset", "by_size"]


@dataclass(frozen=True)
class MixSources:
    """The datasets' plans and pinned sources: what persistent workers must still match."""

    plans: tuple[PlanSpec, ...]
    specs: tuple[SourceSpec, ...]

    @property
    def shuffle(self) -> bool:
        return all(plan.shuffle for plan in self.plans)


class MixedDataset(OnWorld):
    """Datasets mixed at `weights` (their shares of every global batch).

    Args:
        datasets: a list, or a name -> dataset dict, of StreamingDatasets (same rank and
            world size; all packed with one seq_len, or none).
        weights: one number >= 0 per dataset (ints, Fractions or floats; normalised). None:
            proportional to the rows of each dataset's pass.
        schedule: [(global_step, weights), ...]: piecewise-constant phases, each from its
            global step on (steps >= 1, increasing; `weights` holds before the first).
            `loader.linear_ramp` writes a linear change as such phases.
        seed: kept for compatibility and saved; it no longer changes anything (a step's rows
            are laid out interleaved, in the row sequence's order).
        steps_per_epoch: the mixture's epoch in global steps, if given. Otherwise an
            epoch ends with the step in which `epoch_source` (a name) completes its pass;
            by default the dataset whose pass takes the most steps at these weights (the
            others repeat as their passes run out). iterate_over_all=True: with the step in
            which the last dataset completes one.
    """

    def __init__(
        self,
        datasets: Sequence[StreamingDataset] | Mapping[str, StreamingDataset],
        weights: Sequence[Any] | None = None,
        *,
        schedule: Sequence[tuple[int, Sequence[Any]]] | None = None,
        seed: int | None = None,
        steps_per_epoch: int | None = None,
        epoch_source: str | None = None,
        iterate_over_all: bool = False,
    ) -> None:
        self.names, self.datasets = named_datasets(datasets)
        first = self.datasets[0]
        self.world: World = first.world
        self.peers = first.peers  # every dataset of a mixture has the same processes
        self._ran: tuple[int, Schedule] | None = None  # a loaded state's past batch sizes
        for name, ds in zip(self.names, self.datasets, strict=True):
            if (ds.rank, ds.world_size) != (first.rank, first.world_size):
                raise ValueError(
                    f"datasets[{name!r}] is rank {ds.rank} of {ds.world_size}, datasets"
                    f"[{self.names[0]!r}] rank {first.rank} of {first.world_size}: build all on one world"
                )
        self._check_packing()
        check_columns(self.names, self.datasets)
        self._weights_given = weights is not None
        if weights is None:
            weights = by_size(
                [ds.num_splits * ds.units_per_split(ds.epoch) for ds in self.datasets]
            )
        shares = Weights.of(weights, len(self.datasets))
        self._schedule = tuple(schedule_phases(schedule, len(self.datasets)))
        self._rule_given = (steps_per_epoch, epoch_source, iterate_over_all) != (None, None, False)
        rule = self._epoch_rule(shares, steps_per_epoch, epoch_source, iterate_over_all)
        seed = args.optional_integer("seed", seed, 0)
        self.mix_plan = MixPlan(
            (Phase(0, shares), *self._schedule),
            tuple(ds.num_splits for ds in self.datasets),
            self._units,
            seed,
            rule,
            tuple(_fixed_rows(ds) for ds in self.datasets),
        )
        sources = []
        for ds in self.datasets:
            epoch, cursors, _ = ds.progress.position()
            sources.append(SourceAt(epoch, tuple(cursors)))
        self.progress = MixProgress(self, MixPosition.start(sources))
        for k, ds in enumerate(self.datasets):  # their epoch and len() follow the mixture
            ds.join_mixture(self, k)

    def _epoch_rule(
        self, shares: Weights, steps: int | None, source: str | None, over_all: bool
    ) -> str | int:
        if steps is not None:
            return args.integer("steps_per_epoch", steps, 1)
        if source is not None:
            if source not in self.names:
                raise ValueError(f"epoch_source={source!r} is not one of {list(self.names)}")
            k = self.names.index(source)
            if shares.shares[k] == 0:
                raise ValueError(f"epoch_source={source!r} has weight 0: its pass never ends")
            return pass_of(k)
        if args.boolean("iterate_over_all", over_all):
            return ALL_PASSES
        rows = [ds.num_splits * ds.units_per_split(ds.epoch) for ds in self.datasets]
        return pass_of(longest_pass(rows, shares))

    def _units(self, k: int, epoch: int) -> int:
        return self.datasets[k].units_per_split(epoch)

    def _check_packing(self) -> None:
        packed = {ds.packing.spec.seq_len if ds.packing else None for ds in self.datasets}
        if len(packed) > 1:
            raise ValueError(
                f"the datasets of a mixture must all pack to one seq_len, or none pack: got "
                f"pack_sequences {sorted(packed, key=str)}"
            )
        outputs = {
            (ds.packing.spec.fields, ds.packing.spec.dtype.name)
            for ds in self.datasets
            if ds.packing
        }
        if len(outputs) > 1:
            raise ValueError(
                f"the packed datasets of a mixture must give one batch: the same pack_fields "
                f"and pack_dtype on each, got {sorted(outputs)}"
            )

    # -- what the loader reads ----------------------------------------------------------

    @property
    def weights(self) -> list[float]:
        """The weights in force for the next global step."""
        return [float(f) for f in self._weights_now().fractions()]

    def _weights_now(self) -> Weights:
        return self.mix_plan.weights_at(self.progress.mix_position().global_step)

    def set_weights(self, weights: Sequence[Any], at_step: int) -> None:
        """`weights` from global step `at_step` on (every rank alike; see
        `loader.mixture.reweight` and `StreamingDataLoader.set_weights`)."""
        reweight.set_weights(self, weights, at_step)

    @property
    def phases(self) -> list[tuple[int, list[Fraction]]]:
        """The weight phases: (global step, weights) each, as exact fractions."""
        return [(p.start, p.weights.fractions()) for p in self.mix_plan.phases]

    @property
    def reader(self) -> MixReader:
        return MixReader([ds.reader for ds in self.datasets])

    @property
    def units(self) -> Any:
        """The first dataset's units (rows, or blocks of one seq_len: all datasets alike)."""
        return self.datasets[0].units

    def use_shuffle(self, shuffle: bool) -> None:
        """The loader's `shuffle=` (LitData's spelling), applied to every dataset."""
        for ds in self.datasets:
            ds.use_shuffle(shuffle)

    @property
    def packing(self) -> Any:
        """The first dataset's packing (all share seq_len), or None."""
        return self.datasets[0].packing

    @property
    def plan(self) -> MixSources:
        return MixSources(
            tuple(ds.plan for ds in self.datasets), tuple(ds.source.spec for ds in self.datasets)
        )

    @property
    def source(self) -> ResolvedSource:
        """The source that sets the loader's read defaults: an object store's if any is one."""
        for ds in self.datasets:
            if is_remote(ds.source.spec):
                return ds.source
        return self.datasets[0].source

    @property
    def num_splits(self) -> int:
        """Splits of all datasets together (what the state's size is proportional to)."""
        return sum(ds.num_splits for ds in self.datasets)

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    def set_epoch(self, epoch: int) -> None:
        refuse_resharding(self.rank, self.world_size)  # Accelerate's wrappers call this first
        self.progress.set_epoch(args.integer("epoch", epoch, 0))

    def __getstate__(self) -> dict[str, Any]:
        """A copy (e.g. pickled to a worker) leaves the process groups with the original."""
        state = self.__dict__.copy()
        state["peers"] = None
        return state

    def __iter__(self) -> Iterator[Any]:
        refuse_resharding(self.rank, self.world_size)
        raise TypeError(
            "read a MixedDataset through StreamingDataLoader(mixture, global_batch_size=G)"
        )

    # -- state --------------------------------------------------------------------------

    def make_state(self, batching: Batching) -> dict[str, Any]:
        pos = self.progress.mix_position()
        return {
            st.KEY_FORMAT: ms.FORMAT,
            st.KEY_FORMAT_VERSION: ms.FORMAT_VERSION,
            ms.KEY_NAMES: list(self.names),
            ms.KEY_WEIGHTS: self.mix_plan.weights_at(pos.phase_start).text(),
            ms.KEY_PHASES: [p.saved() for p in self.mix_plan.phases],
            ms.KEY_SEED: self.mix_plan.seed,
            ms.KEY_EPOCH_RULE: self.mix_plan.epoch_rule,
            st.KEY_EPOCH: pos.epoch,
            st.KEY_STEP: pos.step,
            st.KEY_GLOBAL_STEP: pos.global_step,
            st.KEY_WORLD_SIZE: self.world_size,
            st.KEY_GLOBAL_BATCH: batching.rows_at(pos.global_step, self.world_size),
            **schedule_state(batching, self.world_size, self._ran),
            ms.KEY_PHASE_START: pos.phase_start,
            ms.KEY_PHASE_COUNTS: list(pos.counts),
            ms.KEY_EPOCH_PASSES: list(pos.epoch_passes),
            ms.KEY_SUPPLIED: list(pos.supplied),
            ms.KEY_EMPTY_PASSES: list(pos.empty_passes),
            ms.KEY_STEPS_SKIPPED: [list(r) for r in self.progress.steps_skipped],
            **(
                {ms.KEY_SKIPS_PENDING: pending}
                if (pending := self.progress.skips.pending(pos.global_step))
                else {}
            ),
            ms.KEY_SOURCES: [
                ds.state_at(at.epoch, list(at.cursors))
                for ds, at in zip(self.datasets, pos.sources, strict=True)
            ],
        }

    def state_dict(self) -> dict[str, Any]:
        return self.make_state(Batching(None, False, self.world_size))

    def load_state_dict(self, state: dict[str, Any], drop_last: bool | None = None) -> None:
        """Validate `state` against this mixture and move to it (effective at the next iteration).

        Each dataset loads its own part (re-pinning its table, checking its plan). New
        weights take effect from the resumed step: each dataset's pass goes on from its
        cursors, so no row of a current pass is read twice and none is skipped.
        """
        if not ms.is_mixture(state):
            raise ValueError(
                "this is a single dataset's state, not a mixture's (format "
                f"{state.get(st.KEY_FORMAT) if isinstance(state, dict) else None!r}); load it "
                "into that StreamingDataset"
            )
        ms.check_mixture_state(state)
        if state[ms.KEY_NAMES] != list(self.names):
            raise ValueError(
                f"mixture state field 'names' is {state[ms.KEY_NAMES]} but this mixture has "
                f"{list(self.names)}; build the mixture with the saved datasets, in that order"
            )
        sources = []
        for k, (name, ds) in enumerate(zip(self.names, self.datasets, strict=True)):
            try:
                ds.load_state_dict(state[ms.KEY_SOURCES][k])
            except ValueError as err:
                raise ValueError(f"mixture state field 'sources[{k}]' ({name!r}): {err}") from err
            epoch, cursors, _ = ds.progress.position()
            sources.append(SourceAt(epoch, tuple(cursors)))
        count = len(self.names)
        saved = Weights.of([_parse(t) for t in state[ms.KEY_WEIGHTS]], count, "state weights")
        global_step = state[st.KEY_GLOBAL_STEP]
        self._ran = ran_schedule(state)
        phase_start = state[ms.KEY_PHASE_START]
        history = (
            saved_phases(state[ms.KEY_PHASES], count)
            if ms.KEY_PHASES in state
            else (Phase(phase_start, saved),)  # states before schedules: the phase in force
        )
        base = self.mix_plan.phases[0].weights if self._weights_given else None
        phases = resumed_phases(history, base, self._schedule, global_step)
        rule = self.mix_plan.epoch_rule
        if not self._weights_given and not self._rule_given:  # adopt the saved epoch too
            rule = state[ms.KEY_EPOCH_RULE]
        self.mix_plan = replace(self.mix_plan, phases=phases, epoch_rule=rule)
        self.progress.steps_skipped = [list(r) for r in state.get(ms.KEY_STEPS_SKIPPED, [])]
        for start, stop in state.get(ms.KEY_SKIPS_PENDING, []):  # with those registered here
            self.progress.skips.add(start, stop)
        self.progress.move(
            MixPosition(
                epoch=state[st.KEY_EPOCH],
                step=state[st.KEY_STEP],
                global_step=global_step,
                phase_start=phase_start,
                counts=tuple(state[ms.KEY_PHASE_COUNTS]),
                sources=tuple(sources),
                epoch_passes=tuple(state[ms.KEY_EPOCH_PASSES]),
                supplied=tuple(state[ms.KEY_SUPPLIED]),
                empty_passes=tuple(state.get(ms.KEY_EMPTY_PASSES, (0,) * count)),
            )
        )

    # -- the dashboard's facts ----------------------------------------------------------

    def facts(self, global_batch: int | None = None) -> dict[str, Any]:
        """Per dataset: units read since the run began, passes, and the weights in force
        since `phase_start` (the data of the `mixture` telemetry event: text and int lists).
        With the global batch G, also the layout of the next global step: `step_segments`,
        triples (dataset, first position, rows), one per run of one dataset's rows in the
        interleaved layout (None beyond STEP_RUNS_SHOWN runs: a big step would fill the event)."""
        pos = self.mix_plan.entering(self.progress.mix_position())
        seq_len = self.packing.spec.seq_len if self.packing is not None else None
        segments: list[int] | None = None
        if global_batch:
            segments = layout_runs(self.mix_plan.layout(pos, global_batch, 0, global_batch))
        return {
            "step_segments": segments,
            "names": list(self.names),
            "weights": list(self.mix_plan.weights_at(pos.global_step).text()),
            "phase_start": pos.phase_start,
            "supplied": list(pos.supplied),
            "tokens_supplied": [u * seq_len for u in pos.supplied] if seq_len else None,
            "passes": [s.epoch for s in pos.sources],
            "dataset_splits": [ds.num_splits for ds in self.datasets],
            "dataset_rows": [ds.num_rows for ds in self.datasets],  # N of each (the Planner)
        }

    def __repr__(self) -> str:
        shares = ", ".join(
            f"{n}={w}" for n, w in zip(self.names, self._weights_now().text(), strict=True)
        )
        return f"MixedDataset({shares}, rank {self.rank}/{self.world_size}, epoch {self.epoch})"


STEP_RUNS_SHOWN = 256  # runs of a step's layout a telemetry event carries at most


def layout_runs(labels: NDArray[np.int64]) -> list[int] | None:
    """A layout as flat triples (dataset, first position, rows), one per run of equal
    labels; None when empty or longer than STEP_RUNS_SHOWN runs."""
    if len(labels) == 0:
        return None
    starts = np.flatnonzero(np.diff(labels)) + 1
    if len(starts) >= STEP_RUNS_SHOWN:
        return None
    firsts = np.concatenate(([0], starts))
    counts = np.diff(np.append(firsts, len(labels)))
    return np.stack([labels[firsts], firsts, counts], axis=1).reshape(-1).tolist()


def _fixed_rows(ds: StreamingDataset) -> bool:
    """Whether every pass of `ds` holds the same rows, read straight (no transform): then
    many passes inside a step are one read (`MixPlan.fixed`)."""
    reader = ds.reader
    return ds.packing is None and type(reader) is BatchReader and not reader.transform


def _parse(text: Any) -> Fraction:
    return Fraction(str(text))


def CombinedStreamingDataset(  # LitData's class name
    datasets: Sequence[StreamingDataset],
    seed: int = 42,
    weights: Sequence[float] | None = None,
    iterate_over_all: bool = True,
    batching_method: str = "stratified",
    force_override_state_dict: bool = False,
) -> MixedDataset:
    """LitData's spelling of a mixture, where its meaning agrees (docs/migrating.md).

    iterate_over_all=True (LitData's default) reads every dataset's pass, in proportion to
    its size, and takes no weights (as LitData); iterate_over_all=False mixes at `weights`
    and the epoch ends when a dataset completes its pass. Batches always mix datasets
    ("stratified", interleaved); `seed` is accepted and changes nothing.
    """
    if iterate_over_all and weights is not None:
        raise ValueError(
            "weights with iterate_over_all=True: reading every dataset once fixes the shares "
            "(their sizes); pass iterate_over_all=False to mix at weights"
        )
    if batching_method != "stratified":
        raise ValueError(
            f"batching_method={batching_method!r}: every batch of a mixture holds rows of each "
            "dataset at its weight ('stratified'); per-stream batches are not offered"
        )
    if force_override_state_dict:
        raise ValueError(
            "force_override_state_dict=True: a mixture refuses a state whose datasets differ; "
            "pass allow_source_change=True to the StreamingDataset whose table changed"
        )
    mix = MixedDataset(datasets, weights, seed=seed, iterate_over_all=iterate_over_all)
    if not iterate_over_all:  # LitData's: the epoch ends when a dataset runs out
        mix.mix_plan = replace(mix.mix_plan, epoch_rule=FIRST_PASS)
    return mix
