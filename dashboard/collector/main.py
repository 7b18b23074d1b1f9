"""The collector app: settings on `app.state`, routers included, nothing else.

`app` (settings from the environment) is what `uvicorn dashboard.collector.main:app` serves;
`create_app(settings)` gives tests and `launch.py` their own instance.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from dashboard.collector.config import Settings
from dashboard.collector.routes import events, health, runs


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    store = getattr(app.state, "store", None)
    if store is not None:
        store.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    settings.check_bind()
    app = FastAPI(title="elastic-loader collector", version="1", lifespan=_lifespan)
    app.state.settings = settings
    app.state.store = None
    app.include_router(health.router)
    app.include_router(events.router, max_body_size=settings.max_body_bytes)
    app.include_router(runs.router)
    return app


app = create_app()
