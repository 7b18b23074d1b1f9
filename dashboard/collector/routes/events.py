"""Ingest: ranks POST batches of events here; the body limit is set where it is included."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, status
from fastapi.exceptions import RequestValidationError

from dashboard.collector.deps import TOKEN_ERRORS, SettingsDep, StoreDep, TokenDep
from dashboard.collector.models import CROSS_FIELD_RULES, ErrorPublic, EventBatchIn, IngestPublic
from dashboard.collector.store import RunConflict, TooManyNewRuns
from loader.wire import INGEST_PATH

router = APIRouter(prefix=INGEST_PATH, tags=["events"], dependencies=[TokenDep])

INGEST_ERRORS: dict[int | str, dict[str, Any]] = {
    **TOKEN_ERRORS,
    409: {"model": ErrorPublic, "description": "an event contradicts its run (another S)"},
    413: {"model": ErrorPublic, "description": "body over the collector's size limit"},
    429: {"model": ErrorPublic, "description": "too many new runs this minute; retry later"},
    422: {
        "description": "a field out of its type or range, or a rule between fields broken. "
        + CROSS_FIELD_RULES,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}
        },
    },
}


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=IngestPublic, responses=INGEST_ERRORS
)
def ingest(batch: EventBatchIn, store: StoreDep, settings: SettingsDep) -> IngestPublic:
    """Store a validated batch atomically; anything malformed was already a 4xx.

    Timestamps must lie in [now - keep_days, now + max_clock_skew_s]: a rank whose clock is
    far off is refused (422) rather than stored, since one event from the far future would
    move its run's "now" and empty every live view of it.
    """
    now = time.time()
    _check_clock(batch, now - settings.keep_days * 86400, now + settings.max_clock_skew_s)
    try:
        stored = store.ingest(batch.events, now)
        return IngestPublic(accepted=len(batch.events), duplicates=len(batch.events) - stored)
    except RunConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    except TooManyNewRuns as exc:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS, detail=str(exc), headers={"Retry-After": "60"}
        ) from None


def _check_clock(batch: EventBatchIn, lo: float, hi: float) -> None:
    errors = [
        {
            "type": "ts_out_of_range",
            "loc": ["body", "events", i, "ts"],
            "msg": f"ts must be within [{lo:.0f}, {hi:.0f}] (now - retention, now + skew): "
            "check the rank's clock",
            "input": e.ts,
        }
        for i, e in enumerate(batch.events)
        if not lo <= e.ts <= hi
    ]
    if errors:
        raise RequestValidationError(errors[:10])
