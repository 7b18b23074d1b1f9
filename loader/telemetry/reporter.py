"""What a loader tells the dashboard, behind one object: the loader calls its reporter
unconditionally, and with telemetry off the reporter is the no-op `Reporter`.

`connect` builds a `TelemetryReporter` from the loader's facts (the rank's static fields)
when a collector URL is set (argument or environment); it owns the `TelemetryClient` and
gives it the loader's position (the loader held weakly: a collected loader ends its client
with `closed`). `checkpoint_written` is the hook `loader.checkpoint.save` calls: every live
reporter whose loader is at the saved state puts the checkpoint on the timeline.
Standard library only at import (the client is imported by `connect`).
"""

from __future__ import annotations

import os
import sys
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from loader import wire
from loader.layout import owned_splits, rank_shares, slice_bounds

if TYPE_CHECKING:
    from loader.readable import Readable
    from loader.telemetry.client import TelemetryClient


class StreamingDataLoader(Protocol):
    """What a reporter reads of its loader (`loader.dataloader.StreamingDataLoader`): a
    Protocol, so this lower room never imports the loader that builds it."""

    streaming_dataset: Readable
    batch_size: int | None
    num_workers: int
    _telemetry: Reporter
    _batching: Any  # `loader.progress.Batching`: G at a step

    @property
    def global_batch_size(self) -> int: ...

    @property
    def splits(self) -> range: ...

    @property
    def step(self) -> int: ...

    @property
    def global_step(self) -> int: ...


_LIVE: weakref.WeakSet[TelemetryReporter] = weakref.WeakSet()
MIXTURE_HEARTBEATS = 5  # a live mixture event every 5 heartbeats (5 s by default)
CACHE_EVERY_S = 5.0  # node-cache totals this often (`node_stats` reads a small folder)


def checkpoint_written(state: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """`loader.checkpoint.save` wrote `state` to `path`: the loaders at that state say so."""
    for reporter in list(_LIVE):
        reporter.saved_if_mine(state, path)


class Reporter:
    """Telemetry off: every report is a no-op (and costs nothing)."""

    @property
    def client(self) -> TelemetryClient | None:
        """The telemetry client, when telemetry is on."""
        return None

    @property
    def lineage(self) -> str | None:
        """The run a state of this loader belongs to (`loader.state.KEY_LINEAGE`): the
        telemetry run id; None with telemetry off."""
        return None

    def on_batch(self, rows: int, wait_s: float) -> None:
        """One batch reached the training loop, after `wait_s` seconds of waiting for it."""

    def epoch_end(self, epoch: int, step: int, global_step: int) -> None:
        """The loader handed out the last batch of `epoch`."""

    def steps_skipped(self, start: int, stop: int, global_step: int) -> None:
        """Global steps [start, stop) will be skipped (`skip_steps`)."""

    def checkpoint_loaded(
        self, state: Mapping[str, Any], world_size: int, global_step: int
    ) -> None:
        """The loader resumed from `state` on `world_size` ranks."""

    def checkpoint_saved(self, path: str | None, epoch: int, step: int, global_step: int) -> None:
        """The user says a checkpoint of the current position was written (`note_checkpoint_saved`)."""

    def mixture(
        self, epoch: int, step: int, global_step: int, facts: dict[str, Any], live: bool = False
    ) -> None:
        """A mixture's weights and per-dataset progress (at each `for` and each resume, and
        `live` every few heartbeats while batches flow)."""

    def state_taken(self, state: Mapping[str, Any]) -> None:
        """`state_dict()` returned `state` (inside a DCP save, that is a checkpoint)."""

    def saved_if_mine(self, state: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
        """`state` was written to `path`: a checkpoint of this loader if it is at `state`."""

    def close(self) -> None:
        """Flush and stop (bounded)."""


class TelemetryReporter(Reporter):
    """Reports of one loader to a collector through its `TelemetryClient`."""

    def __init__(self, client: TelemetryClient, loader: StreamingDataLoader) -> None:
        self._client = client
        self._loader = weakref.ref(loader)
        # held weakly: this reporter lives with the loader; the dataset and batching held
        # strongly give the `closed` event the loader's final position once it is gone
        ds, batching = loader.streaming_dataset, loader._batching
        client.set_snapshot(self.snapshot, where=lambda: position_at(ds, batching))
        _LIVE.add(self)
        # A mixture's per-dataset progress is global (every rank computes the same): rank 0
        # sends it live, every `mixture_every_s` while batches flow.
        self._live_mixture = loader.streaming_dataset.rank == 0 and _is_mixture(loader)
        self.mixture_every_s = MIXTURE_HEARTBEATS * client.interval_s
        self._mixture_sent = time.monotonic()  # the `for`'s `mixture` event is on its way
        self._mixture_stale = False  # batches read since the last report
        self._caches = cache_roots(loader.streaming_dataset)
        self._cache_at = 0.0  # when the node caches' next totals are due

    @property
    def client(self) -> TelemetryClient:
        return self._client

    @property
    def lineage(self) -> str:
        return self._client.run_id

    def snapshot(self) -> dict[str, Any]:
        """The loader's position for `progress` events (`position_of`); {} once it is gone."""
        dl = self._loader()
        return {} if dl is None else position_of(dl)

    def on_batch(self, rows: int, wait_s: float) -> None:
        self._client.on_batch(rows, wait_s)
        if not self._client.settled:  # the first batch of a fresh start: its own run
            self._client.settle()
        self._mixture_stale = True
        if self._live_mixture and time.monotonic() - self._mixture_sent >= self.mixture_every_s:
            self._tell_mixture()
        if self._caches and time.monotonic() >= self._cache_at:
            self.tell_caches()

    def tell_caches(self) -> None:
        """The node totals of each cache the loader reads through (`cache` events, every
        CACHE_EVERY_S): whichever rank of a node sends them, they are the same."""
        from loader.cache_stats import node_stats

        self._cache_at = time.monotonic() + CACHE_EVERY_S
        host = self._client.static.get("host", "")
        for root in self._caches:
            self._event(wire.CACHE, host=host, cache_dir=root, **node_stats(root))

    def _tell_mixture(self) -> None:
        """Rank 0 of a mixture: its per-dataset progress now (`mixture_progress`)."""
        self._mixture_sent = time.monotonic()
        self._mixture_stale = False
        dl = self._loader()
        if dl is not None:
            from loader.readable import tell_mixture

            tell_mixture(self, dl.streaming_dataset, dl.step, dl.global_batch_size, live=True)

    def epoch_end(self, epoch: int, step: int, global_step: int) -> None:
        self._event(wire.EPOCH_END, epoch=epoch, step=step, global_step=global_step)

    def steps_skipped(self, start: int, stop: int, global_step: int) -> None:
        self._event(wire.STEPS_SKIPPED, start=start, stop=stop, global_step=global_step)

    def checkpoint_loaded(
        self, state: Mapping[str, Any], world_size: int, global_step: int
    ) -> None:
        from loader import state as st

        # a default run id gives way to the checkpoint's lineage: the resume joins its run
        lineage = state.get(st.KEY_LINEAGE)
        self._client.settle(lineage if isinstance(lineage, str) else None)
        self._event(
            wire.CHECKPOINT_LOADED,
            world_size_before=state.get(st.KEY_WORLD_SIZE),
            world_size_after=world_size,
            step=state.get(st.KEY_STEP),
            epoch=state.get(st.KEY_EPOCH),
            global_step=global_step,
        )

    def checkpoint_saved(self, path: str | None, epoch: int, step: int, global_step: int) -> None:
        self._event(
            wire.CHECKPOINT_SAVED, path=path, step=step, epoch=epoch, global_step=global_step
        )

    def mixture(
        self, epoch: int, step: int, global_step: int, facts: dict[str, Any], live: bool = False
    ) -> None:
        kind = wire.MIXTURE_PROGRESS if live else wire.MIXTURE
        self._event(kind, epoch=epoch, step=step, global_step=global_step, **facts)

    def state_taken(self, state: Mapping[str, Any]) -> None:
        from loader.telemetry.checkpoints import state_taken

        state_taken(self._client, state)

    def saved_if_mine(self, state: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
        from loader.telemetry.checkpoints import saved_if_mine

        saved_if_mine(self._client, state, path)

    def close(self) -> None:
        # A mixture's last report first: a run shorter than `mixture_every_s` (or its last
        # steps) would otherwise read as its first report on the Progress page.
        if self._live_mixture and self._mixture_stale:
            self._tell_mixture()
        self._client.close()

    def _event(self, kind: str, **fields: Any) -> None:
        self._client.event(kind, **fields)


def cache_roots(dataset: Any) -> list[str]:
    """The node-cache folders a dataset (or each dataset of a mixture) reads through."""
    parts = getattr(dataset, "datasets", None) or [dataset]
    specs = (getattr(ds, "cache_spec", None) for ds in parts)
    return sorted({spec.root for spec in specs if spec is not None})


def _is_mixture(loader: StreamingDataLoader) -> bool:
    from loader.mixture.dataset import MixedDataset

    return isinstance(loader.streaming_dataset, MixedDataset)


def position_of(loader: StreamingDataLoader) -> dict[str, Any]:
    """The loader's position (`position_at` its dataset and batching)."""
    return position_at(loader.streaming_dataset, loader._batching)


def position_at(ds: Any, batching: Any) -> dict[str, Any]:
    """What `progress` events say of a loader's position: epoch, steps, its splits and their
    cursors, and what the units add (packed data: tokens of its part of each split, a
    shared one in part: `rank_shares`). The splits follow G, which a batch_schedule
    changes: the event carries the G (and batch size) they were worked out with, one G
    read once, so the collector checks them against that G, not the first one."""
    from loader.mixture.dataset import MixedDataset

    progress = ds.progress
    where = {"epoch": progress.epoch, "step": progress.step, "global_step": progress.global_step}
    if isinstance(ds, MixedDataset):  # per dataset, not per split: `mixture` events
        return where
    g = batching.rows_at(progress.global_step, ds.world_size)
    splits = owned_splits(ds.rank, ds.world_size, ds.num_splits, g)
    own = progress.cursors[splits.start : splits.stop]
    shares = rank_shares(ds.rank, ds.world_size, ds.num_splits, g)
    read = sum(c * n // of for c, (n, of) in zip(own, shares, strict=True))
    lo, hi = slice_bounds(ds.rank, ds.world_size, g)
    return {
        **where,
        "splits": [splits.start, splits.stop],
        "cursors": list(own),
        "global_batch_size": g,
        "batch_size": hi - lo,
        # the units no rank reads this epoch on this W (the state's `skipped`)
        wire.BALANCE_SKIPPED: progress.peek(batching).skipped,
        **ds.units.progress_facts(read, progress.epoch),
    }


def close_loaders(*loaders: StreamingDataLoader, timeout_s: float | None = None) -> None:
    """Close several loaders' telemetry together, under one deadline (default: the 2 s
    exit budget): `dl.close()` one after the other waits up to that long for each when the
    collector does not answer. At a process's end all its loaders are closed this way."""
    from loader import args
    from loader.telemetry.exit import EXIT_BUDGET_S, close_together

    budget = args.seconds("timeout_s", timeout_s) or EXIT_BUDGET_S
    clients: list[Any] = [c for dl in loaders if (c := dl._telemetry.client) is not None]
    close_together(clients, budget)


def process_of(dataset: Any) -> dict[str, Any]:
    """Which process this is (issue 26): its global rank (torch.distributed's when it is
    initialised, else the dataset's rank) and, on a DeviceMesh, its coordinate on each dim
    (`mesh_coordinates`; absent without a mesh). Replicas of one data-parallel rank (its
    tensor-parallel peers) are so told apart by the collector."""
    out: dict[str, Any] = {"global_rank": int(dataset.rank)}
    torch = sys.modules.get("torch")  # imported by the loader already; never imported here
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        out["global_rank"] = int(dist.get_rank())
    mesh = getattr(dataset, "mesh_coordinates", None)
    if mesh:
        out["mesh"] = {str(k): int(v) for k, v in mesh.items()}
    return out


def connect(
    loader: StreamingDataLoader,
    url: str | None,
    run_id: str | None,
    total_epochs: int | None,
    total_steps: int | None,
) -> Reporter:
    """The loader's reporter: to the collector at `url` (or the environment's), else none.
    A bad `total_epochs` / `total_steps` is a ValueError naming it, telemetry on or off."""
    from loader.readable import placed_as
    from loader.telemetry.client import TelemetryClient
    from loader.telemetry.settings import job_length

    ds = loader.streaming_dataset
    static = {
        **process_of(ds),
        "rank": ds.rank,
        "local_rank": ds.world.local_rank,
        "world_size": ds.world_size,
        "num_workers": loader.num_workers,
        **placed_as(ds, loader.global_batch_size),
        "batch_size": loader.batch_size,
        "global_batch_size": loader.global_batch_size,
        **job_length(total_epochs, total_steps),
    }
    if ds.units.tokens_per_unit is not None:
        static["seq_len"] = ds.units.tokens_per_unit
    client = TelemetryClient.from_settings(url, run_id, static)
    return Reporter() if client is None else TelemetryReporter(client, loader)
