"""`GET /metrics` for Prometheus: the same token rule as `/api` (scrapers send a bearer)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from dashboard.collector.deps import TOKEN_ERRORS, HealthDep, SettingsDep, StoreDep, TokenDep
from dashboard.collector.metrics import scrape

router = APIRouter(tags=["metrics"], dependencies=[TokenDep], responses=TOKEN_ERRORS)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
def metrics(store: StoreDep, health: HealthDep, settings: SettingsDep) -> Response:
    """Every run's state and its processes' rates, steps and silence (docs/dashboard.md);
    a run leaves it `metrics_keep_s` after its last report."""
    body = scrape(store, health, keep_s=settings.metrics_keep_s)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
