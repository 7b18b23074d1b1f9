"""Pydantic models at the HTTP boundary: what ranks may send and what the API returns.

Inbound models are strict and closed (`extra="forbid"`): a typo in a client is a 422, not a
silently missing column. Outbound models document the JSON in OpenAPI; the routes serialise
plain dicts with orjson for speed, and the tests check the two agree.
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
    Scalar,
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


class RunPublic(BaseModel):
    run_id: str
    first_ts: float
    last_ts: float
    last_recv: float | None = None  # the collector's clock when it received the last event
    world_size: int
    prev_world_size: int | None
    num_splits: int
    rows_per_split: int
    batch_size: int | None
    total_epochs: int | None
    total_steps: int | None
    ranks: int
    events: int


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int


class AttemptPublic(BaseModel):
    """One attempt of a run: a launcher's job (torchrun run id, SLURM job, ...) or its
    restart; a crash and the resume from its checkpoint are two attempts of one run.
    `ended`: its processes by how their `closed` said they ended (`exit`, `close`, `error`,
    `terminated`), `silent` for those that sent none (killed, or still running)."""

    attempt: str
    first_ts: float
    last_ts: float
    world_size: int
    processes: int
    ended: dict[str, int]


class AttemptsPublic(BaseModel):
    data: list[AttemptPublic]
    count: int


class RankStatePublic(BaseModel):
    """running, stalled, crashed, terminated or closed (dashboard/collector/status.py);
    `silent_s` since its last report, `no_step_s` since its step last moved; `why` a rank is
    stalled, crashed or terminated: `silent`, `no step`, `error` (its `closed` said the
    process ended on an uncaught exception of type `error`), `signal`, or `after rank N
    died`; `first` marks the process that died first."""

    rank: int  # the data-parallel rank
    state: str
    silent_s: float
    last_ts: float
    process: int = 0  # the global rank: several processes share a rank on a mesh
    mesh: dict[str, int] | None = None  # its coordinate on each mesh dim
    global_step: int | None
    why: str | None = None
    error: str | None = None
    no_step_s: float = 0.0
    first: bool = False  # the process that died first: the cause of the others' end


class StatusPublic(BaseModel):
    """The run's state: starting, running, stalled, crashed, restarted, finished or stopped;
    `ranks` lists the crashed, stalled and terminated ranks (the first to die first, then
    worst first, at most 64), `counts` all of them by state."""

    state: str
    resumed: bool
    now: float
    last_ts: float
    counts: dict[str, int]
    missing: int
    ranks: list[RankStatePublic]
    headline: str
    stopped_at: str | None = None  # "33.8 % of epoch 2": closed mid-epoch, no length stated


class RankPublic(BaseModel):
    rank: int
    host: str
    local_rank: int
    gpu: int
    num_workers: int
    world_size: int
    splits: list[int]
    cursors: list[int] | None
    epoch: int | None
    step: int | None
    global_step: int | None
    interval_s: float | None
    rows_per_s: float
    ts: float
    state: str
    silent_s: float | None
    tokens: int | None = None  # packed data: tokens handed out this epoch
    blocks_per_split: int | None = None  # packed data: what the cursors count up to
    global_batch_size: int | None = None  # G (None from clients older than it)
    replicas: str | None = None  # on a mesh: "dp 0: ranks 0, 1 (tp)", its processes


class PartPublic(BaseModel):
    """Rows [start, stop) of a shared split's `rows_per_step` in every full global step."""

    rank: int
    start: int
    stop: int


class SharedSplitPublic(BaseModel):
    """A split that more than one rank reads, and who reads which part."""

    split: int
    parts: list[PartPublic]


class LayoutPublic(BaseModel):
    """One world size's placement (`loader.layout`): `owner[s]` is the first rank that
    reads split s (-1: not known yet); `shared` the splits read in parts by several ranks
    (the step layout, G a multiple of S and W not dividing S); `rows_per_step` is G/S."""

    world_size: int
    global_batch_size: int | None
    rows_per_step: int | None
    owner: list[int]
    shared: list[SharedSplitPublic]
    ranks: list[RankPublic]


class MixtureSegmentPublic(BaseModel):
    """Positions [start, stop) of one dataset's rows in the step, and who reads which."""

    start: int
    stop: int
    parts: list[PartPublic]


class MixtureDatasetPublic(BaseModel):
    name: str
    weight: str  # the share of every global step, as a fraction ("7/10")
    splits: int
    rows: int | None = None  # N of the dataset (None from loaders before issue 33)
    segments: list[MixtureSegmentPublic]  # in the step `global_step` (two across a pass end)


class MixturePlacementPublic(BaseModel):
    """A mixture: every rank reads positions [r·G/W, (r+1)·G/W) of each step, which hold
    rows of every dataset; the layout shown is of step `global_step`."""

    global_step: int | None
    rows_per_step: int | None
    datasets: list[MixtureDatasetPublic]


class PlacementPublic(BaseModel):
    run_id: str
    num_splits: int
    rows_per_split: int
    supported_world_sizes: list[int]  # the divisors of S (any W without a global batch)
    any_world_size_up_to: int | None  # G, when G is a multiple of S: every W <= G fits
    status: StatusPublic
    current: LayoutPublic
    previous: LayoutPublic | None
    mixture: MixturePlacementPublic | None = None  # a run of several datasets


class RankProgressPublic(BaseModel):
    rank: int
    epoch: int | None
    step: int | None
    global_step: int | None
    state: str
    rows_per_s: float
    rows_done: int
    rows_total: int
    pct: float
    tokens: int | None  # packed data: tokens this rank handed out this epoch
    replicas: str | None = None  # on a mesh: "dp 0: ranks 0, 1 (tp)", its processes


class JobProgressPublic(BaseModel):
    """The job as a whole, when it stated `total_epochs` or `total_steps`."""

    total_epochs: int | None
    total_steps: int | None
    pct: float | None
    eta_s: float | None
    label: str | None


class ProgressPublic(BaseModel):
    """`epoch_pct` is the per-rank bars' total, computed from the same read. `unit` says what
    cursors, `rows_*` and `rows_per_s` count: "rows", or "blocks" of `seq_len` tokens for
    packed data, whose `tokens_*` fields give the same in tokens (None for row data)."""

    run_id: str
    state: str
    epoch: int | None
    epochs_done: int | None  # epochs every reporting rank completed
    global_step: int | None
    job: JobProgressPublic
    rows_per_split: int
    cursors: list[int | None]
    owner: list[int]
    rows_done: int
    rows_total: int
    epoch_pct: float
    rows_per_s: float
    eta_s: float | None
    ranks: list[RankProgressPublic]
    unit: str
    seq_len: int | None
    tokens_done: int | None
    tokens_total: int | None
    tokens_per_s: float | None
    skipped: int = 0  # units (`unit`) of the epoch no rank reads on this W, for balance


class BandPointPublic(BaseModel):
    """Rows/s across the ranks that reported in one bucket; a new `segment` after a gap."""

    t: float
    segment: int
    ranks: int
    median: float
    min: float
    max: float
    wait_median: float
    wait_max: float


class RankWindowPublic(BaseModel):
    rank: int
    rows_per_s: float
    wait_share: float


class RankWaitPublic(BaseModel):
    rank: int
    wait_share: float


class InputBoundPublic(BaseModel):
    """Share of step time the training loop waited for data: median rank, worst ranks."""

    job_share: float | None
    ranks: list[RankWaitPublic]
    bound: list[int]
    verdict: str


class StragglerPublic(BaseModel):
    rank: int
    rows_per_s: float
    stall_frac: float
    reason: str


class ThroughputPublic(BaseModel):
    run_id: str
    crashed_at: float | None  # the last report of the crashed ranks, if the run crashed
    crashed_before: list[float] = []  # each crash a resume followed: its last report
    bucket_s: float
    band: list[BandPointPublic]
    count: int
    slowest: list[RankWindowPublic]
    stragglers: list[StragglerPublic]
    input: InputBoundPublic
    tokens_per_s: float | None  # packed data: the job's tokens/s over the last 30 s


class EventPublic(BaseModel):
    kind: str
    ts: float
    rank: int
    world_size: int
    epoch: int | None
    step: int | None
    global_step: int | None
    data: dict[str, Scalar | list[int] | list[str]]


class EventsPublic(BaseModel):
    data: list[EventPublic]
    count: int


class TimelineItemPublic(BaseModel):
    """Discrete events of all ranks folded into one line, e.g. 'W 8 → 4 at step 1,200'."""

    kind: str
    ts: float
    end_ts: float | None
    epoch: int | None
    step: int | None
    world_size: int
    world_size_before: int | None
    path: Scalar
    ranks: int
    label: str


class TimelinePublic(BaseModel):
    data: list[TimelineItemPublic]
    count: int
