"""Liveness for `launch.py` and load balancers: open without a token, cheap to call."""

from __future__ import annotations

from fastapi import APIRouter

from dashboard.collector.deps import GUARD_ERRORS, SettingsDep, StoreDep
from dashboard.collector.models import HealthPublic

router = APIRouter(tags=["health"], responses=GUARD_ERRORS)


@router.get("/health", response_model=HealthPublic)
def health(settings: SettingsDep, store: StoreDep) -> HealthPublic:
    return HealthPublic(
        status="ok", db=settings.db, events=store.count(), token_required=bool(settings.token)
    )
