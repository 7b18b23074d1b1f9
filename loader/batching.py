"""How a StreamingDataLoader cuts its stream: its batching from the user's arguments, the
default read size, which torch arguments it takes, and the tasks still to read."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

from loader import args
from loader.mixture.dataset import MixedDataset
from loader.progress import Batching
from loader.readable import Position, Readable, Stream, check_fits
from loader.world import check_alike, digest

READ_ROWS = 8192  # units per read by default: rows ...
READ_TOKENS = 1 << 18  # ... or packed blocks of about this many tokens (bigger measured slower)
# ... of the default batch, whose fields take 32 B a token, plus ~4 B a token read: a packed
# read holds about READ_BYTES, so a narrow batch (pack_fields/pack_dtype) reads more tokens
READ_BYTES = READ_TOKENS * (32 + 4)
DEFAULT_BATCH: Any = object()  # batch_size left out: 1, or what global_batch_size makes it
_PLANNED = ("sampler", "batch_sampler")  # the plan decides which rows, in which order
_IN_ORDER = (
    "in_order=False hands out batches in the order workers finish them, so on several ranks "
    "global batch t would mix different steps of different ranks (and each rank's state would "
    "differ); it is supported on one rank (world_size=1), where the state holds the batches "
    "handed out ahead of the others. On several ranks keep in_order=True (the default) and "
    "raise num_workers/prefetch_factor for throughput"
)


def pending_tasks(stream: Stream, progress: Position, per_read: int) -> Iterator[Any]:
    """The stream's tasks of up to `per_read` batches, leaving out batches already handed
    out (ahead of the others, with in_order=False), up to the next range of steps to skip
    (asked as each task is issued, so a range registered meanwhile counts)."""
    index = 0
    while index < (limit := progress.issue_limit(stream)):  # no further than a range to skip
        if progress.handed_out(index):
            index += 1
            continue
        stop = index + 1
        while stop < min(index + per_read, limit) and not progress.handed_out(stop):
            stop += 1
        yield stream.task(index, stop - index)
        index = stop


def default_read_size(tokens_per_unit: int | None, field_bytes: int = 32) -> int:
    """Units per read when the user gives none: 8192 rows, or blocks of about READ_BYTES
    (the tokens read and the `field_bytes` a token the batch's fields take): 2**18 tokens,
    128 blocks of 2048, for the default batch (a read of 8192 such blocks would allocate
    ~0.5 GB of fields at once, and reads of 512 measured ~1.6x slower per token than reads
    of 128); 576 blocks of int32 input_ids alone, which measured ~1.3x the tokens/s of 128
    (benchmarks/README.md, #21)."""
    if tokens_per_unit is None:
        return READ_ROWS
    return max(1, READ_BYTES // (field_bytes + 4) // tokens_per_unit)


def default_read(dataset: Readable) -> int:
    """Units per read when the user gives none (`default_read_size`). A mixture's read
    makes one take per dataset, each with a fixed cost (~0.35 ms on Lance, whatever its
    rows), so its default holds one default read per dataset: each dataset's take is then,
    on average, as long as its read alone (benchmarks/README.md, issue #27)."""
    units = dataset.units
    size = default_read_size(units.tokens_per_unit, units.field_bytes)
    return size * len(dataset.datasets) if isinstance(dataset, MixedDataset) else size


def batching_of(
    dataset: Readable,
    batch_size: int | None,
    global_batch_size: int | None,
    drop_last: bool,
    batch_schedule: Any = None,
) -> Batching:
    """The loader's batching from batch_size (per rank) or global_batch_size (G), checked
    against the dataset's layout (`loader.layout` says which world sizes fit), and its
    batch-size schedule."""
    batching = _fixed_batching(dataset, batch_size, global_batch_size, drop_last)
    if batch_schedule is None:
        return batching
    return replace(batching, schedule=schedule_of(dataset, batching, batch_schedule))


def check_placement(dataset: Readable, batching: Batching) -> None:
    """The rest of the placement a loader adds, alike on every process that builds its
    dataset (else ValueError on each, naming the first that differs and the field): a
    process with another batch size or schedule, or mixture weights, reads other rows."""
    peers = getattr(dataset, "peers", None)
    if peers is None:  # a copy (in a worker), or a readable that agrees with nobody
        return
    plan = getattr(dataset, "mix_plan", None)
    phases = () if plan is None else tuple((p.start, p.weights.text()) for p in plan.phases)
    fields = (
        ("batch sizes", digest((batching.batch_size, batching.global_batch, batching.drop_last))),
        ("batch_schedule", digest(batching.schedule)),
        ("weights", digest(phases)),
    )
    check_alike(peers, fields, "StreamingDataLoader")


def schedule_of(
    dataset: Readable, batching: Batching, batch_schedule: Any
) -> tuple[tuple[int, int], ...]:
    """`batch_schedule=[(global_step, G), ...]` checked: steps rising from 1, each G a
    multiple of S that W ranks can read (as `global_batch_size`, which is G before the
    first step given; a mixture's step is one layout of G rows: any G >= W)."""
    if batching.global_batch is None:
        raise ValueError(
            "batch_schedule needs global_batch_size (G before the first step of the schedule, "
            "a multiple of num_splits), not batch_size"
        )
    if isinstance(batch_schedule, str | bytes | dict) or not isinstance(batch_schedule, Sequence):
        raise TypeError(
            f"batch_schedule must be a list of (global_step, global_batch_size) pairs, got "
            f"{type(batch_schedule).__name__}"
        )
    out: list[tuple[int, int]] = []
    splits = 1 if isinstance(dataset, MixedDataset) else dataset.num_splits  # a mixture: any G
    for i, item in enumerate(batch_schedule):
        name = f"batch_schedule[{i}]"
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 2:
            raise TypeError(f"{name} must be a (global_step, global_batch_size) pair, got {item!r}")
        step = args.step(f"{name}'s global_step", item[0], out[-1][0] + 1 if out else 1)
        rows = args.integer(f"{name}'s global_batch_size", item[1], 1)
        if rows % splits:
            raise ValueError(
                f"{name} = ({step}, {rows}): each global_batch_size of a schedule must be a "
                f"multiple of num_splits={splits} (e.g. {splits * max(1, rows // splits)}), so "
                f"step t is the same rows on every world size"
            )
        check_fits(dataset, dataset.world_size, rows)
        out.append((step, rows))
    if batching.global_batch % splits:
        raise ValueError(
            f"global_batch_size={batching.global_batch} with batch_schedule must be a multiple "
            f"of num_splits={splits}, as each G of the schedule"
        )
    return tuple(out)


def rampup_schedule(
    start: int, increment: int, ramp_samples: int, global_batch_size: int
) -> list[tuple[int, int]]:
    """Megatron's `--rampup-batch-size START INCREMENT RAMP_SAMPLES` with
    `--global-batch-size GBS` as a `batch_schedule` (pass `global_batch_size=START`).

    Megatron sizes each step from the samples consumed before it: GBS once they exceed
    RAMP_SAMPLES, else START + INCREMENT * floor(consumed / (RAMP_SAMPLES / increments)),
    increments = (GBS - START) // INCREMENT. This is that rule in exact arithmetic, one
    stage at a time (O(increments), not O(steps)).
    """
    start = args.integer("start", start, 1)
    increment = args.integer("increment", increment, 1)
    ramp_samples = args.integer("ramp_samples", ramp_samples, 1)
    gbs = args.integer("global_batch_size", global_batch_size, start)
    increments = (gbs - start) // increment
    if increments == 0:
        return []
    per = Fraction(ramp_samples, increments)  # samples per increment

    def size(consumed: int) -> int:
        if consumed > ramp_samples:
            return gbs
        return start + int(consumed / per) * increment if per else gbs

    out: list[tuple[int, int]] = []
    step, consumed, rows = 0, 0, start
    while rows != gbs:
        next_at = (int(consumed / per) + 1) * per  # consumed samples of the next increment
        steps = min(math.ceil((next_at - consumed) / rows), (ramp_samples - consumed) // rows + 1)
        step, consumed = step + steps, consumed + steps * rows
        if size(consumed) != rows:
            rows = size(consumed)
            out.append((step, rows))
    return out


def _fixed_batching(
    dataset: Readable,
    batch_size: int | None,
    global_batch_size: int | None,
    drop_last: bool,
) -> Batching:
    drop_last = args.boolean("drop_last", drop_last)
    world = dataset.world_size
    if global_batch_size is None:
        batch_size = args.integer("batch_size", 1 if batch_size is DEFAULT_BATCH else batch_size, 1)
        _check_storable("batch_size", batch_size, world)
        check_fits(dataset, world, batch_size * world)
        return Batching(batch_size, drop_last)
    global_batch_size = args.integer("global_batch_size", global_batch_size, 1)
    _check_storable("global_batch_size", global_batch_size, 1)
    if batch_size is not DEFAULT_BATCH:
        batch_size = args.integer("batch_size", batch_size, 1)
        if batch_size * world != global_batch_size:
            raise ValueError(
                f"batch_size={batch_size} on world_size={world} makes a global batch of "
                f"{batch_size * world}, not global_batch_size={global_batch_size}; pass one "
                f"of them"
            )
    check_fits(dataset, world, global_batch_size)
    return Batching(None, drop_last, global_batch_size)


def _check_storable(name: str, value: int, world: int) -> None:
    """The state holds G = value * world as an int64: refuse at construction a G it could
    not hold (the run would train, then fail to save or load its own state)."""
    if value * world >= args.COUNT_LIMIT:
        per = f" on world_size={world}" if world > 1 else ""
        raise ValueError(
            f"{name}={value}{per} makes a global batch of {value * world}; the state holds it "
            f"as an int64, so it must be below 2**63 ({args.COUNT_LIMIT})"
        )


def check_torch_kwargs(dataset: Readable, shuffle: Any, kwargs: dict[str, Any]) -> bool | None:
    """Accept torch/LitData arguments that agree with the plan, refuse those that do not;
    the `shuffle` to apply (as LitData: see `StreamingDataset.use_shuffle`)."""
    planned = [k for k in _PLANNED if kwargs.get(k) is not None]
    if planned:
        raise ValueError(
            f"{planned} are decided by the plan (shuffle=/shuffle_seed= on the dataset); "
            f"remove them"
        )
    for key in _PLANNED:
        kwargs.pop(key, None)
    if kwargs.get("in_order", True) is not True and dataset.world_size > 1:
        raise ValueError(_IN_ORDER)
    if kwargs.get("in_order", True) is not True and isinstance(dataset, MixedDataset):
        raise ValueError("in_order=False: a mixture's batches are recorded in order")
    return None if shuffle is None else args.boolean("shuffle", shuffle)


class _Then:
    """`first`, then `second`, on each batch (picklable for workers under spawn)."""

    def __init__(self, first: Callable[[Any], Any], second: Callable[[Any], Any]) -> None:
        self.first, self.second = first, second

    def __call__(self, batch: Any) -> Any:
        return self.second(self.first(batch))


def then(
    first: Callable[[Any], Any] | None, second: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    """The loader's per-batch function: `batch_transform`, then torch's `collate_fn` (which
    can only apply to batches the loader made: it collates rows itself)."""
    if first is None or second is None:
        return first or second
    return _Then(first, second)
