"""StreamingDataLoader: a torch DataLoader whose batches follow the elastic order.

The loader samples `BatchTask`s, not row indices: the main process turns "batch t of
this rank" into a small task (the rank's cursors before t, and a count), and whichever
process reads it (the main one, or any worker) computes the rows from the plan alone. So
the batch sequence is the same for any num_workers, workers share nothing, and the state
is what the training loop received, never what workers prefetched.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader

from loader import args, batching
from loader.dataset import StreamingDataset
from loader.layout import owned_splits, slice_bounds
from loader.mixture.dataset import MixedDataset
from loader.read.ahead import prefetch_bytes, start_prefetch
from loader.read.prefetch import auto_reads_in_flight, map_ahead
from loader.readable import Position, Readable, Stream, tell_mixture
from loader.skips import already_skipped
from loader.state import KEY_LINEAGE
from loader.tasks import BatchReads, TaskSampler, as_is, pinned_read
from loader.telemetry import reporter
from loader.workers.context import clean_worker_context
from loader.workers.mainguard import check_main_guard
from loader.workers.stacks import StackDumps
from loader.workers.watchdog import (
    DEFAULT_DATA_TIMEOUT_S,
    DataWaitTimeout,
    WorkerPids,
    wait_limit,
    watched_batches,
)

__all__ = ["DataWaitTimeout", "StreamingDataLoader"]

_DEFAULT_BATCH = batching.DEFAULT_BATCH


class StreamingDataLoader(DataLoader[Any]):
    """Batches of `batch_size` rows from a StreamingDataset, stateful and elastic.

    Args:
        dataset: the StreamingDataset of this rank.
        batch_size: rows per batch on this rank (the global batch is W * batch_size).
        global_batch_size: G, the rows of one step on all ranks, instead of batch_size:
            with G a multiple of num_splits any world size up to G works (rank r takes
            rows [r*G//W, (r+1)*G//W) of each step, so per-rank batches differ by at most
            one where W does not divide G; `loss_scale` makes the gradient exact).
        batch_schedule: a batch-size ramp (Megatron's `--rampup-batch-size`), with
            global_batch_size: `[(global_step, G), ...]`, G from that global step on (steps
            rising, each G a multiple of num_splits, W <= every G). Step t is the next G(t)
            rows of the epoch, so it is the same rows on every W and every row comes once;
            `loss_scale`, `len()` and `global_batch_size` follow the schedule, and a state
            resumes mid-ramp on any W (the resuming loader's schedule applies from there).
        num_workers: worker processes; they change nothing in what is yielded.
        drop_last: drop this epoch's final short batch.
        shuffle: as LitData: turns the dataset's shuffling on (or off) while nothing has
            been read from it and no state loaded (its seed is kept); once reading started,
            a `shuffle` that contradicts the dataset is refused. None: the dataset's.
        batch_transform: called on each batch dict inside the worker.
        collate_fn: torch's argument, applied the only way it can be: to each batch the
            loader has already made (a dict of tensors of b rows, in the elastic order), in
            the worker, after `batch_transform`; the loader reads and collates rows itself,
            so it never sees single rows.
        telemetry, run_id: collector URL and run name (default: ELASTIC_LOADER_TELEMETRY,
            ELASTIC_LOADER_RUN_ID); no URL anywhere means no telemetry.
        total_epochs, total_steps: how long the job means to run, if it knows: the
            dashboard then shows "epoch x of N" and the job's ETA (telemetry only).
        reads_in_flight: reads running at once in each reading process, to hide the
            store's latency: with num_workers=0 the next reads run ahead in threads; in a
            worker each read is cut into that many sub-reads. None: 16 for an object store
            (shared among workers, at least 2 each), 4 locally with no workers, 1 in a
            local worker. 0: no threads. The batches and the state are the same whatever
            it is; memory in flight is at most about reads_in_flight + 2 reads per process.
            (Replaces `read_ahead`, still accepted with a warning.)
        read_size: rows per read: consecutive batches are read together (one sorted read
            in which each split's rows form one run) and handed out one by one. The batches
            are the same whatever it is; it trades memory in flight for fewer, longer reads.
            Default 8192 rows; with pack_sequences it counts blocks, default 2**18 tokens'
            worth (128 blocks of 2048), more for a narrow batch (576 blocks of 2048 with
            int32 input_ids alone: reads of about the same bytes). A mixture's default is
            that of its datasets times their number (one take per dataset a read).
        cache_prefetch_bytes: with a node cache (`cache_dir=`), the bytes of files the next
            tasks read that this rank fetches ahead into it in the background (an int or
            '512MB'; default 256 MiB, at most half of `cache_limit`; 0: off). Never changes
            the batches (docs/cache.md).
        data_timeout_s: with workers, the longest this rank waits for one read from them
            (default 600 s; None: forever; read when an iteration starts, and the first
            read includes starting the workers). torch's `timeout=` applies the same way
            when it is smaller (a stopped worker's handshake escapes torch's own check).
            Past the limit the Python stacks of the main process and every worker are
            written to a file, the workers are killed and the loop raises
            `DataWaitTimeout` naming them and the file (within about 5 s more: torch's
            status-check interval), so a stopped or stuck worker fails the rank instead of
            hanging it, and says where it was stuck.
        **kwargs: passed to torch's DataLoader (pin_memory, persistent_workers,
            prefetch_factor, multiprocessing_context, timeout, ...).

    `in_order=False` (one rank only) hands out batches as workers finish them; the state
    then holds the batches handed out ahead of the others, so a resume (same batch size)
    reads every row once. Refused: `sampler`/`batch_sampler` (the plan decides the rows),
    `in_order=False` on several ranks (global batch t would mix steps), and a `shuffle`
    that contradicts a dataset already read.
    """

    # Accelerate's `prepare` hands back, untouched, a loader that says it is prepared: this
    # one already reads only its rank's rows (re-sharding or dispatching them would read
    # each row on one process only, or hang). Checkpoint it with the documented recipe,
    # `accelerator.register_for_checkpointing(dl)` (docs/trainers.md).
    _is_accelerate_prepared = True

    def __init__(
        self,
        dataset: Readable,
        batch_size: Any = _DEFAULT_BATCH,
        num_workers: int = 0,
        drop_last: bool = False,
        *,
        global_batch_size: int | None = None,
        batch_schedule: Sequence[tuple[int, int]] | None = None,
        shuffle: bool | None = None,
        batch_transform: Callable[[dict[str, Any]], Any] | None = None,
        telemetry: str | None = None,
        run_id: str | None = None,
        total_epochs: int | None = None,
        total_steps: int | None = None,
        reads_in_flight: int | None = None,
        read_size: int | None = None,
        cache_prefetch_bytes: int | str | None = None,
        data_timeout_s: float | None = DEFAULT_DATA_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        if isinstance(dataset, BatchReads):  # its own reads: a framework rebuilding it
            raise TypeError(
                "a StreamingDataLoader is being rebuilt from its parts (a framework swapping "
                "in a sampler of its own?): it already reads only this process's rows, so "
                "hand it over as it is (Lightning: use_distributed_sampler=False; "
                "docs/trainers.md)"
            )
        if not isinstance(dataset, StreamingDataset | MixedDataset):
            raise TypeError(
                f"StreamingDataLoader needs a StreamingDataset or a MixedDataset, got "
                f"{type(dataset).__name__}"
            )
        in_flight_name, reads_in_flight = args.renamed(
            "reads_in_flight", reads_in_flight, "read_ahead", kwargs
        )
        shuffle = batching.check_torch_kwargs(dataset, shuffle, kwargs)
        num_workers = args.integer("num_workers", num_workers, 0)
        self.streaming_dataset = dataset
        self._batching = batching.batching_of(
            dataset, batch_size, global_batch_size, drop_last, batch_schedule
        )
        if self._batching.schedule and kwargs.get("in_order", True) is not True:
            raise ValueError("batch_schedule with in_order=False: keep in_order=True")
        batching.check_placement(dataset, self._batching)
        self.loss_scale = 1.0  # world_size / rows of the global step of the latest batch
        reads_in_flight = args.optional_integer(in_flight_name, reads_in_flight, 0)
        if reads_in_flight is None:
            reads_in_flight = auto_reads_in_flight(dataset.source.spec, num_workers)
        self.reads_in_flight = reads_in_flight
        if read_size is None:
            read_size = batching.default_read(dataset)
        read_size = args.integer("read_size", read_size, 1)
        self.batches_per_read = max(1, read_size // self.batch_size)
        self.data_timeout_s = args.seconds("data_timeout_s", data_timeout_s)
        self.cache_prefetch_bytes = prefetch_bytes(cache_prefetch_bytes)
        batch_transform = args.callable_or_none("batch_transform", batch_transform)
        collate_fn = args.callable_or_none("collate_fn", kwargs.pop("collate_fn", None))
        self._workers_read: Any = None  # what persistent workers were started on
        self._latest_workers: WorkerPids | None = None  # of the latest iteration
        sampler = TaskSampler(dataset.progress, self._batching, self.batches_per_read)
        kwargs["collate_fn"] = as_is  # the reader collates; a user's collate_fn runs after it
        if num_workers > 0 and kwargs.get("multiprocessing_context") is None:
            kwargs["multiprocessing_context"] = clean_worker_context()
        self._stacks = StackDumps()  # where workers write their stacks when a wait times out
        kwargs["worker_init_fn"] = self._stacks.worker_init(kwargs.get("worker_init_fn"))
        super().__init__(
            BatchReads(
                dataset,
                batching.then(batch_transform, collate_fn),
                reads_in_flight if num_workers > 0 else 1,
            ),
            batch_size=None,
            sampler=sampler,
            num_workers=num_workers,
            **kwargs,
        )
        self._task_sampler = sampler
        if shuffle is not None:  # every other argument passed: now the plan may change
            dataset.use_shuffle(shuffle)
        self._telemetry = reporter.connect(self, telemetry, run_id, total_epochs, total_steps)

    # DataLoader assigns batch_size/drop_last itself (None/False: batching happens in tasks);
    # these report the loader's own values.
    @property
    def batch_size(self) -> int:
        """Rows of this rank's batch in a full step (G // W or one more where W does not
        divide G)."""
        ds = self.streaming_dataset
        lo, hi = slice_bounds(ds.rank, ds.world_size, self.global_batch_size)
        return hi - lo

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        if value is not None:
            raise AttributeError("batch_size is fixed at construction")

    @property
    def global_batch_size(self) -> int:
        """G: rows of one full step on all ranks (with a batch_schedule, of the next step)."""
        return self._batching.rows_at(self.global_step, self.streaming_dataset.world_size)

    @property
    def splits(self) -> range:
        """The splits this rank reads from (whole, or in part where a split is shared)."""
        ds = self.streaming_dataset
        return owned_splits(ds.rank, ds.world_size, ds.num_splits, self.global_batch_size)

    @property
    def drop_last(self) -> bool:
        return self._batching.drop_last

    @drop_last.setter
    def drop_last(self, value: Any) -> None:
        if value is not False:
            raise AttributeError("drop_last is fixed at construction")

    @property
    def progress(self) -> Position:
        """The position (the dataset's: loaders over one dataset share it)."""
        return self.streaming_dataset.progress

    def __len__(self) -> int:
        """Batches of this epoch on this rank: those already handed out plus those to come.

        After a resume it still counts the whole epoch, as Lightning and progress bars expect.
        """
        return self.progress.batches(self._batching)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._check_workers_source()
        if self.num_workers > 0:
            check_main_guard(self._start_method())
        epoch = self.progress.position()[0]
        while True:  # one stream, or more where a range of steps is skipped in the middle
            self.progress.apply_skips(self._batching)
            if self.progress.position()[0] != epoch:
                return  # the skip went past this epoch's end
            stream = self.progress.start(self._batching)
            self._task_sampler.stream = stream
            tell_mixture(self._telemetry, self.streaming_dataset, self.step, self.global_batch_size)
            if not (yield from self._stream_batches(stream)):
                return

    def _stream_batches(self, stream: Stream) -> Generator[Any, None, bool]:
        """Yield `stream`'s batches; True when it stopped early for a range of steps to skip."""
        epoch_steps = 0
        waited = time.perf_counter()
        for index, batch in self._batches(stream):
            if not self.progress.is_current(stream):
                return False  # a state was loaded or another iteration started: this one is over
            self.progress.record(stream, index)
            epoch_steps = self.progress.step
            self.loss_scale = stream.world_size / stream.global_rows(index)
            self._telemetry.on_batch(stream.task_rows(index), time.perf_counter() - waited)
            yield batch
            if self.progress.skip_due() and not self.progress.ended:
                return True
            waited = time.perf_counter()
        self._telemetry.epoch_end(stream.epoch, epoch_steps, self.global_step)
        return False

    def skip_steps(self, start: int, stop: int) -> None:
        """Jump past global steps [start, stop) when the run reaches them (Megatron's
        `--skip-train-iteration-range`): a loss spike's data is not read again at a resume.

        The rows of the skipped steps are counted in the state (`steps_skipped`) and shown on
        the dashboard's Timeline; every other row still comes once. Global steps count
        batches since the run began (`global_step`). A range may run past an epoch's end:
        the `for` loop over that epoch ends, and the rest is skipped as the next one starts.
        A range not yet reached is kept in the state (`skips_pending`) and skipped after a
        resume on any W; registering a range again (pending, or skipped already) is a no-op.
        With `in_order=False` the loader reads no batch of a range ahead of it; a range
        registered while a `for` runs may find batches of it handed out already (workers
        finish out of order): those count as read, not skipped.
        """
        start = args.step("start", start, 0)
        stop = args.step("stop", stop, start + 1)
        progress = self.progress
        frontier = progress.frontier()
        if stop <= frontier:
            if already_skipped(start, stop, progress.steps_skipped):
                return  # registered again (at every start, from a config): done already
            raise ValueError(
                f"steps [{start}, {stop}) are behind the position (global_step="
                f"{self.global_step}); skip steps at or after it"
            )
        if progress.skips.covers(max(start, frontier), stop):
            return  # pending already (in the state, or registered before)
        progress.skips.add(max(start, frontier), stop)
        self._telemetry.steps_skipped(start, stop, self.global_step)

    def set_weights(self, weights: Sequence[Any], at_step: int) -> None:
        """A mixture's new weights from global step `at_step` on (online reweighting, e.g.
        DoReMi-style): a new phase, exact counts from that step, later phases replaced;
        recorded in the state. Every rank calls it with the same arguments (checked across
        ranks when torch.distributed is initialised); a step already read ahead is refused
        (docs/mixtures.md)."""
        if not isinstance(self.streaming_dataset, MixedDataset):
            raise TypeError("set_weights applies to a loader over a MixedDataset")
        self.streaming_dataset.set_weights(weights, at_step)
        tell_mixture(self._telemetry, self.streaming_dataset, self.step, self.global_batch_size)

    def _batches(self, stream: Stream) -> Iterator[Any]:
        """Batches one by one from reads of several: torch's iterator with workers, our
        threaded read-ahead without them."""
        forked = self.num_workers > 0 and self._start_method() == "fork"  # Lance: not fork-safe
        window = 0 if forked else self.cache_prefetch_bytes
        ahead = start_prefetch(self.streaming_dataset, stream, self.batches_per_read, window)
        pairs = self._pairs(stream)
        return pairs if ahead is None else ahead.follow(pairs)

    def _pairs(self, stream: Stream) -> Iterator[Any]:
        if self.num_workers > 0:
            return self._from_workers()
        if self.reads_in_flight < 1:
            reads: Iterator[Sequence[Any]] = super().__iter__()
        else:
            tasks = batching.pending_tasks(stream, self.progress, self.batches_per_read)
            reads = map_ahead(self.dataset.__getitem__, tasks, self.reads_in_flight)
            if self.pin_memory and torch.cuda.is_available():
                reads = (pinned_read(read) for read in reads)
        return (pair for read in reads for pair in read)

    def _from_workers(self) -> Iterator[Any]:
        """Reads from torch's worker processes, each wait watched when data_timeout_s is set."""
        reads = super().__iter__()
        self._latest_workers = WorkerPids(reads)
        limit = wait_limit(self.data_timeout_s, self.timeout)
        rank = self.streaming_dataset.rank
        return watched_batches(reads, limit, self._latest_workers, rank, self._stacks)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of this loader's live workers (empty before the first iteration)."""
        return self._latest_workers.pids() if self._latest_workers is not None else []

    def _start_method(self) -> str | None:
        context = self.multiprocessing_context
        if context is None:
            return multiprocessing.get_start_method(allow_none=True)
        return str(context.get_start_method())

    def _check_workers_source(self) -> None:
        """Persistent workers keep the dataset copy they started with: a state loaded since
        must not have re-pinned the table or changed the plan under them."""
        if not (self.persistent_workers and self.num_workers > 0):
            return
        ds = self.streaming_dataset
        now = (ds.source, ds.plan)
        if self._workers_read is None or getattr(self, "_iterator", None) is None:
            self._workers_read = now
        elif self._workers_read[0] is not now[0] or self._workers_read[1] != now[1]:
            raise RuntimeError(
                "load_state_dict re-pinned the table version (or adopted the saved seed) after "
                "persistent workers started; create the StreamingDataLoader after loading the state"
            )

    # -- state --------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """Batches of the current epoch handed to the training loop (across resumes)."""
        return self.progress.step

    @property
    def global_step(self) -> int:
        """Batches handed to the training loop since the run began (across epochs, resumes)."""
        return self.progress.global_step

    def state_dict(self) -> dict[str, Any]:
        """Per-split cursors of the batches the training loop received; the same on every rank."""
        state = self.streaming_dataset.make_state(self._batching)
        if self._telemetry.lineage is not None:  # its telemetry run: a resume joins it
            state[KEY_LINEAGE] = self._telemetry.lineage
        self._telemetry.state_taken(state)  # a DCP save shows on the dashboard's timeline
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state` (any world size the saved layout allows); takes effect at the next
        `for` (an iteration already running stops)."""
        self.streaming_dataset.load_state_dict(state, drop_last=self.drop_last)
        self._telemetry.checkpoint_loaded(
            state, self.streaming_dataset.world_size, self.global_step
        )
        tell_mixture(self._telemetry, self.streaming_dataset, self.step, self.global_batch_size)

    def note_checkpoint_saved(self, path: str | None = None) -> None:
        """Tell the dashboard a checkpoint was written (call after saving `state_dict()`)."""
        self._telemetry.checkpoint_saved(path, self.progress.epoch, self.step, self.global_step)

    def close(self) -> None:
        """Flush and stop this loader's telemetry (bounded: about 2 s at most).

        Worth calling at the end of a rank: spawned and forkserver children skip atexit,
        so their last second of telemetry would be lost. Several loaders: close them
        together, `loader.close_loaders(a, b, c)` (one deadline for all).
        """
        self._telemetry.close()
