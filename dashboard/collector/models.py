"""Pydantic models at the HTTP boundary: what ranks may send and what the API returns.

Inbound models are strict and closed (`extra="forbid"`): a typo in a client is a 422, not a
silently missing column. Outbound models document the JSON in OpenAPI; the routes serialise
plain dicts with orjson for speed, and the tests check the two agree.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MAX_EVENTS = 2000
MAX_CURSORS = 1 << 16
MAX_DATA_KEYS = 32

NonNeg = Annotated[int, Field(ge=0, le=1 << 62)]
Seconds = Annotated[float, Field(ge=0, le=1e12)]
Scalar = str | int | float | bool | None
# Any printable text but '/', which could not be one URL path segment (same rule as the client).
RUN_ID_PATTERN = r"^[^/\x00-\x1f\x7f]{1,128}$"
RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN)]


class EventIn(BaseModel):
    """One telemetry event from one rank (see `loader/telemetry.py` for who sends what)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    run_id: RunId
    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
    ts: Seconds
    host: Annotated[str, Field(max_length=255)] = ""
    rank: Annotated[int, Field(ge=0, lt=1 << 20)]
    local_rank: Annotated[int, Field(ge=0, lt=1 << 20)] = 0
    world_size: Annotated[int, Field(ge=1, le=1 << 20)]
    num_workers: Annotated[int, Field(ge=0, le=4096)] = 0
    num_splits: Annotated[int, Field(ge=1, le=1 << 24)]
    rows_per_split: NonNeg = 0
    batch_size: NonNeg | None = None
    epoch: NonNeg | None = None
    step: NonNeg | None = None
    splits: Annotated[list[NonNeg], Field(min_length=2, max_length=2)] | None = None
    cursors: Annotated[list[NonNeg], Field(max_length=MAX_CURSORS)] | None = None
    tokens: NonNeg | None = None  # packed data: tokens handed out this epoch by the rank
    rows: NonNeg = 0
    batches: NonNeg = 0
    wait_s: Seconds = 0.0
    interval_s: Seconds = 0.0
    rows_per_s: Seconds = 0.0
    data: Annotated[dict[str, Scalar | list[int]], Field(max_length=MAX_DATA_KEYS)] = {}


class EventBatchIn(BaseModel):
    """What one POST carries: a rank's events of about one second."""

    model_config = ConfigDict(extra="forbid", strict=True)

    events: Annotated[list[EventIn], Field(min_length=1, max_length=MAX_EVENTS)]


class IngestPublic(BaseModel):
    accepted: int


class HealthPublic(BaseModel):
    status: str
    db: str
    events: int
    token_required: bool


class RunPublic(BaseModel):
    run_id: str
    first_ts: float
    last_ts: float
    world_size: int
    prev_world_size: int | None
    num_splits: int
    rows_per_split: int
    batch_size: int | None
    ranks: int
    events: int


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int


class RankPublic(BaseModel):
    rank: int
    host: str
    local_rank: int
    num_workers: int
    world_size: int
    splits: list[int]
    cursors: list[int] | None
    epoch: int | None
    step: int | None
    rows_per_s: float
    ts: float


class LayoutPublic(BaseModel):
    """One world size's placement: `owner[s]` is the rank that reads split s."""

    world_size: int
    owner: list[int]
    ranks: list[RankPublic]


class PlacementPublic(BaseModel):
    run_id: str
    num_splits: int
    supported_world_sizes: list[int]
    current: LayoutPublic
    previous: LayoutPublic | None


class RankProgressPublic(BaseModel):
    rank: int
    epoch: int | None
    step: int | None
    rows_done: int
    rows_total: int
    pct: float


class ProgressPublic(BaseModel):
    run_id: str
    epoch: int | None
    rows_per_split: int
    cursors: list[int | None]
    owner: list[int]
    rows_done: int
    rows_total: int
    epoch_pct: float
    rows_per_s: float
    eta_s: float | None
    ranks: list[RankProgressPublic]


class SamplePublic(BaseModel):
    rank: int
    t: float
    rows_per_s: float
    wait_per_step_s: float
    stall_frac: float


class StragglerPublic(BaseModel):
    rank: int
    rows_per_s: float
    stall_frac: float
    reason: str


class ThroughputPublic(BaseModel):
    run_id: str
    bucket_s: float
    data: list[SamplePublic]
    count: int
    stragglers: list[StragglerPublic]


class EventPublic(BaseModel):
    kind: str
    ts: float
    rank: int
    world_size: int
    epoch: int | None
    step: int | None
    data: dict[str, Scalar | list[int]]


class EventsPublic(BaseModel):
    data: list[EventPublic]
    count: int


class TimelineItemPublic(BaseModel):
    """Discrete events of all ranks folded into one line, e.g. 'W 8 → 4 at step 1,200'."""

    kind: str
    ts: float
    epoch: int | None
    step: int | None
    world_size: int
    world_size_before: int | None
    ranks: int
    label: str


class TimelinePublic(BaseModel):
    data: list[TimelineItemPublic]
    count: int
