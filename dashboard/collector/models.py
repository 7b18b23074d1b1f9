"""Pydantic models at the HTTP boundary of writes: what ranks may send, and the answers
to ingest and health (what reads return: `answers.py`).

Inbound models are strict and closed (`extra="forbid"`): a typo in a client is a 422, not a
silently missing column.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dashboard.collector.fields import (
    MAX_CURSORS,
    MAX_DATA_KEYS,
    MAX_EVENTS,
    MAX_PROCESSES,
    MAX_RUNS_PER_REQUEST,
    DataValue,
    MeshDim,
    NonNeg,
    RunId,
    Seconds,
    Text,
)
from loader.layout import fit_reason, owned_splits
from loader.wire import (
    KIND_PATTERN,
    MAX_SPLITS,
    MAX_WORLD_SIZE,
)

CROSS_FIELD_RULES = """Rules beyond each field's type and range (JSON Schema cannot state \
them), each a 422 naming the rule:

- `rank` < `world_size`;
- `world_size` fits `num_splits` and `global_batch_size` G (`loader.layout.fit_reason`): with G a multiple of S any W <= G; otherwise, and from clients that send no G, W divides S (and G);
- `splits`, when sent, is `loader.layout.owned_splits(rank, W, S, G)`: `[rank * S / W, (rank + 1) * S / W]` where W divides S, else the splits the rank's slice of each step touches (the ones it shares at its edges included);
- `cursors`, when sent, has one entry per split in `splits`;
- `ts` lies in [now - keep_days, now + max_clock_skew_s] on the collector's clock;
- `seq` and `incarnation` are sent together or not at all;
- one request carries events of at most 8 run ids.

And one the store checks against what it holds (409): a run's `num_splits` never changes."""


class EventIn(BaseModel):
    """One telemetry event from one rank (see `loader/telemetry/client.py` for who sends what).

    Besides each field's type and range, an event must agree with itself: rank < W, W
    ranks can read S splits with the global batch G (`loader.layout.fit_reason`: any
    W <= G when G is a multiple of S; without G, from clients older than it, W must divide
    S), `splits` is the range `loader.layout.owned_splits` gives this rank (shared splits
    at its edges included), `cursors` has one entry per split in it. (That S stays the
    run's S is the store's check.)
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={
            "description": "One telemetry event of one rank.\n\n" + CROSS_FIELD_RULES
        },
    )

    run_id: RunId
    kind: Annotated[str, Field(pattern=KIND_PATTERN)]
    ts: Seconds
    host: Annotated[Text, Field(max_length=255)] = ""
    rank: Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]
    local_rank: Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)] = 0
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]
    num_workers: Annotated[int, Field(ge=0, le=4096)] = 0
    num_splits: Annotated[int, Field(ge=1, le=MAX_SPLITS)]
    rows_per_split: NonNeg = 0
    batch_size: NonNeg | None = None
    global_batch_size: Annotated[int, Field(ge=1, le=1 << 62)] | None = None  # G, all ranks
    epoch: NonNeg | None = None
    step: NonNeg | None = None
    global_step: NonNeg | None = None
    total_epochs: NonNeg | None = None
    total_steps: NonNeg | None = None
    splits: Annotated[list[NonNeg], Field(min_length=2, max_length=2)] | None = None
    cursors: Annotated[list[NonNeg], Field(max_length=MAX_CURSORS)] | None = None
    tokens: NonNeg | None = None  # packed data: tokens handed out this epoch by the rank
    blocks_per_split: NonNeg | None = None  # packed data: what a cursor counts up to
    seq_len: NonNeg | None = None  # packed data: tokens per block (rows count blocks)
    heartbeat_s: Annotated[float, Field(gt=0, le=3600)] | None = None  # the client's period
    # The process (issue 26): its global rank (torch.distributed's; the data-parallel
    # `rank` when absent) and its coordinate on each dim of its DeviceMesh. Processes that
    # share a data-parallel rank (tensor-parallel peers) are told apart by these.
    global_rank: Annotated[int, Field(ge=0, lt=MAX_PROCESSES)] | None = None
    mesh: (
        Annotated[dict[MeshDim, Annotated[int, Field(ge=0, lt=MAX_PROCESSES)]], Field(max_length=8)]
        | None
    ) = None
    sent_ts: Seconds | None = None  # the rank's clock when this batch left (progress only)
    # Idempotence (issue 33): the sending client (random, one per client object, so a
    # restarted process is a new one) and the event's number in its stream (from 0, one
    # more each event). A number at or below the highest stored for its client is ignored.
    # Clients older than it send neither: stored as they come (best effort).
    incarnation: Annotated[str, Field(pattern=r"^[0-9a-f]{8,64}$")] | None = None
    seq: NonNeg | None = None
    # The launcher's job that sent it (torchrun's run id, SLURM's job id, ...) and its restart:
    # a run (one checkpoint lineage) lists its attempts (crash, resume) by this.
    attempt: Annotated[Text, Field(min_length=1, max_length=160)] | None = None
    rows: NonNeg = 0
    batches: NonNeg = 0
    wait_s: Seconds = 0.0
    interval_s: Seconds = 0.0
    rows_per_s: Seconds = 0.0
    data: Annotated[
        dict[Annotated[Text, Field(max_length=64)], DataValue], Field(max_length=MAX_DATA_KEYS)
    ] = {}

    @property
    def process(self) -> int:
        """The sending process: its global rank, or its data-parallel rank without one."""
        return self.rank if self.global_rank is None else self.global_rank

    @model_validator(mode="after")
    def _agrees_with_itself(self) -> EventIn:
        if (self.seq is None) != (self.incarnation is None):
            raise ValueError("seq and incarnation come together (the client and its count)")
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        layout = f"W={self.world_size}, S={self.num_splits}, G={self.global_batch_size}"
        reason = fit_reason(self.num_splits, self.world_size, self.global_batch_size)
        if reason:
            raise ValueError(f"{reason} ({layout})")
        mine = owned_splits(self.rank, self.world_size, self.num_splits, self.global_batch_size)
        owned = [mine.start, mine.stop]
        if self.splits is not None and self.splits != owned:
            raise ValueError(f"splits {self.splits} are not rank {self.rank}'s {owned} ({layout})")
        if self.cursors is not None and len(self.cursors) != len(mine):
            raise ValueError(
                f"cursors has {len(self.cursors)} entries; rank {self.rank} reads "
                f"{len(mine)} splits ({layout})"
            )
        return self


class EventBatchIn(BaseModel):
    """What one POST carries: a rank's events of about one second."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    events: Annotated[list[EventIn], Field(min_length=1, max_length=MAX_EVENTS)]

    @model_validator(mode="after")
    def _few_runs(self) -> EventBatchIn:
        runs = {e.run_id for e in self.events}
        if len(runs) > MAX_RUNS_PER_REQUEST:
            raise ValueError(
                f"one request may carry events of at most {MAX_RUNS_PER_REQUEST} runs, "
                f"got {len(runs)}: send each run's events in its own request"
            )
        return self


class ErrorPublic(BaseModel):
    """Every refusal other than a validation error: what was wrong and how to fix it."""

    detail: str


class IngestPublic(BaseModel):
    """`accepted`: events of the request; `duplicates`: those ignored as a repeat or an older
    number of their client (`seq`), so a retried or replayed batch changes nothing."""

    accepted: int
    duplicates: int = 0


class HealthPublic(BaseModel):
    status: str
    db: str
    events: int
    token_required: bool
