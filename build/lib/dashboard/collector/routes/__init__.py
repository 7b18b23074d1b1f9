"""One `APIRouter` per resource: health, events (ingest and listing), runs (views)."""
