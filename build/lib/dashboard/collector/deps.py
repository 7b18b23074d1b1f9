"""FastAPI dependencies as `Annotated` aliases: settings, the store, the token check, a run.

The app factory puts `Settings` on `app.state`; tests swap any of these with
`app.dependency_overrides`. The store opens lazily so importing the app touches no disk.
The dependencies that do no I/O are `async`: a sync one costs a threadpool hop per request,
which made a one-event ingest ~30 % dearer in server CPU.
"""

from __future__ import annotations

import hmac
import threading
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dashboard.collector.config import Settings
from dashboard.collector.models import ErrorPublic
from dashboard.collector.status import Health
from dashboard.collector.store import Store
from dashboard.collector.throughput import SettledBands

_open_lock = threading.Lock()
_bearer = HTTPBearer(auto_error=False)


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_store(request: Request, settings: SettingsDep) -> Store:
    state = request.app.state
    with _open_lock:
        if getattr(state, "store", None) is None:
            state.store = Store(settings.db, settings.retention())
    store: Store = state.store
    return store


StoreDep = Annotated[Store, Depends(get_store)]


async def get_health(settings: SettingsDep) -> Health:
    return settings.health()


HealthDep = Annotated[Health, Depends(get_health)]


async def get_bands(request: Request) -> SettledBands:
    bands: SettledBands = request.app.state.bands
    return bands


BandsDep = Annotated[SettledBands, Depends(get_bands)]


async def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """When the collector has a token, every API request must carry it as a Bearer token."""
    if settings.token is None:
        return
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(credentials.credentials.encode(), settings.token.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="wrong token")


TokenDep = Depends(require_token)

# What OpenAPI says a route may answer besides 200 and 422 (FastAPI adds 422 itself).
GUARD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "Host header not one this collector serves"},
    403: {"model": ErrorPublic, "description": "wrong token, or no token and a foreign address"},
}
TOKEN_ERRORS: dict[int | str, dict[str, Any]] = {
    **GUARD_ERRORS,
    401: {"model": ErrorPublic, "description": "missing token: send 'Authorization: Bearer'"},
}
RUN_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorPublic, "description": "no such run (or it was removed by retention)"}
}


def get_run(run_id: str, store: StoreDep) -> dict[str, Any]:
    run = store.run(run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run_id!r} not found")
    return run


RunDep = Annotated[dict[str, Any], Depends(get_run)]
