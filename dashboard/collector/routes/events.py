"""Ingest: ranks POST batches of events here; the body limit is set where it is included."""

from __future__ import annotations

from fastapi import APIRouter, status

from dashboard.collector.deps import StoreDep, TokenDep
from dashboard.collector.models import EventBatchIn, IngestPublic

router = APIRouter(prefix="/api/events", tags=["events"], dependencies=[TokenDep])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=IngestPublic)
def ingest(batch: EventBatchIn, store: StoreDep) -> IngestPublic:
    """Store a validated batch atomically; anything malformed was already a 4xx."""
    return IngestPublic(accepted=store.ingest(batch.events))
