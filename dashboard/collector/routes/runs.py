"""Read side: runs and, per run, placement, progress, throughput, events and timeline.

Handlers return orjson bytes: the `response_model`s document the JSON in OpenAPI without
re-validating thousands of samples on every 1-second dashboard refresh.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Response

from dashboard.collector import caches, status, timeline, views
from dashboard.collector.answers import (
    AttemptsPublic,
    CachesPublic,
    EventsPublic,
    PlacementPublic,
    ProgressPublic,
    RunPublic,
    RunsPublic,
    StatusPublic,
    ThroughputPublic,
    TimelinePublic,
)
from dashboard.collector.deps import (
    RUN_ERRORS,
    TOKEN_ERRORS,
    BandsDep,
    HealthDep,
    RunDep,
    StoreDep,
    TokenDep,
)
from dashboard.collector.throughput import MAX_POINTS, throughput
from loader.wire import KIND_PATTERN

router = APIRouter(
    prefix="/api/runs", tags=["runs"], dependencies=[TokenDep], responses=TOKEN_ERRORS
)


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _listing(data: list[dict[str, Any]]) -> Response:
    return _json({"data": data, "count": len(data)})


@router.get("", response_model=RunsPublic)
def list_runs(store: StoreDep) -> Response:
    return _listing(store.runs())


@router.get("/{run_id}", response_model=RunPublic, responses=RUN_ERRORS)
def get_run(run: RunDep) -> Response:
    return _json(run)


@router.get("/{run_id}/attempts", response_model=AttemptsPublic, responses=RUN_ERRORS)
def get_attempts(run: RunDep, store: StoreDep) -> Response:
    """The run's attempts, first first: a crash and its resume (joined by the checkpoint's
    lineage) are two attempts of one run."""
    return _listing(store.attempts(run["run_id"]))


@router.get("/{run_id}/status", response_model=StatusPublic, responses=RUN_ERRORS)
def get_status(run: RunDep, store: StoreDep, health: HealthDep) -> Response:
    return _json(status.public(status.run_status(store, run, health=health)))


@router.get("/{run_id}/placement", response_model=PlacementPublic, responses=RUN_ERRORS)
def get_placement(run: RunDep, store: StoreDep, health: HealthDep) -> Response:
    return _json(views.placement(store, run, health))


@router.get("/{run_id}/progress", response_model=ProgressPublic, responses=RUN_ERRORS)
def get_progress(run: RunDep, store: StoreDep, health: HealthDep) -> Response:
    return _json(views.progress(store, run, health))


@router.get("/{run_id}/throughput", response_model=ThroughputPublic, responses=RUN_ERRORS)
def get_throughput(
    run: RunDep,
    store: StoreDep,
    health: HealthDep,
    bands: BandsDep,
    window_s: Annotated[float, Query(gt=0, le=30 * 86400)] = 300.0,
    points: Annotated[int, Query(ge=1, le=MAX_POINTS)] = 120,
) -> Response:
    return _json(throughput(store, run, window_s, points, health, bands))


@router.get("/{run_id}/caches", response_model=CachesPublic, responses=RUN_ERRORS)
def get_caches(run: RunDep, store: StoreDep) -> Response:
    """The run's node caches (host, folder): hit rate, bytes from the store vs the cache,
    evictions, files fetched again, the prefetcher's lead, and what is wrong in words."""
    return _json(caches.caches(store, run, time.time()))


@router.get("/{run_id}/events", response_model=EventsPublic, responses=RUN_ERRORS)
def get_events(
    run: RunDep,
    store: StoreDep,
    kind: Annotated[str | None, Query(pattern=KIND_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    return _listing(store.events(run["run_id"], kind, limit))


@router.get("/{run_id}/timeline", response_model=TimelinePublic, responses=RUN_ERRORS)
def get_timeline(run: RunDep, store: StoreDep, health: HealthDep) -> Response:
    return _listing(timeline.timeline(store, run, health))
