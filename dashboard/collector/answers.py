"""What the API returns for runs: the response models of the read routes.

Kept apart from `models.py` (what ranks may send, strict and closed) because the two change
for different reasons: these document the JSON in OpenAPI; the routes serialise plain dicts
with orjson for speed, and the tests check the two agree.
"""

from __future__ import annotations

from pydantic import BaseModel

from dashboard.collector.fields import Scalar


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


class NodeCachePublic(BaseModel):
    """One node cache (host, folder), from its latest `cache` report: totals since its loader
    started (None where the sender did not report the key); `hit_rate` of file reads,
    `store_share` of bytes; `prefetch_lead` in steps (None without a prefetcher);
    `received_ts` on the collector's clock, `stale` past `stale_after_s`; `warnings` in
    plain words."""

    host: str
    cache_dir: str
    hits: int | None
    misses: int | None
    bytes_from_store: int | None
    bytes_from_cache: int | None
    evictions: int | None
    refetched: int | None
    prefetched: int | None
    prefetch_lead: float | None
    hit_rate: float | None
    store_share: float | None
    received_ts: float
    age_s: float
    stale: bool
    warnings: list[str]


class CachesPublic(BaseModel):
    """A run's node caches by host and folder; `nodes` is empty for a run without a cache."""

    run_id: str
    nodes: list[NodeCachePublic]
    stale_after_s: float
