"""The collector app: settings on `app.state`, the guard, routers included, nothing else.

Nothing is built at import: `create_app` is the factory that uvicorn serves
(`uvicorn --factory dashboard.collector.main:create_app`, settings from the environment)
and that tests and `launch.py` call with their own `Settings`.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError

from dashboard.collector.config import Settings
from dashboard.collector.guard import GuardMiddleware
from dashboard.collector.routes import events, health, metrics, runs
from dashboard.collector.throughput import SettledBands


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    store = getattr(app.state, "store", None)
    if store is not None:
        store.close()


def _printable(value: Any) -> Any:
    """A validation error's field as JSON can carry it: NaN, 2**70 or '\\ud800' as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, tuple):  # `loc`
        value = list(value)
    if isinstance(value, BaseException):  # `ctx.error` of a validator's ValueError
        return str(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):  # `ctx`
        value = {k: _printable(v) for k, v in value.items()}
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)[:200]
    return value


async def _invalid(request: Request, exc: Exception) -> Response:
    """422 with pydantic's errors, whatever the rejected input was (never a 500)."""
    assert isinstance(exc, RequestValidationError)
    errors = [{key: _printable(value) for key, value in e.items()} for e in exc.errors()]
    body = orjson.dumps({"detail": errors})
    return Response(body, 422, media_type="application/json")


def _optional_auth(app: FastAPI, settings: Settings) -> None:
    """Without a token the bearer is optional: say so in OpenAPI (an empty requirement
    beside it), so generated clients and fuzzers do not expect a 401."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operation in (op for path in schema["paths"].values() for op in path.values()):
                if settings.token is None and "security" in operation:
                    operation["security"] = [*operation["security"], {}]
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The collector for `settings` (default: from the environment); see `config.Settings`."""
    settings = settings or Settings.from_env()
    settings.check_bind()
    app = FastAPI(title="elastic-loader collector", version="1", lifespan=_lifespan)
    app.state.settings = settings
    app.state.store = None
    app.state.bands = SettledBands()  # the throughput view's cache: this app's, not the process's
    app.add_middleware(GuardMiddleware, settings=settings)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.include_router(health.router)
    app.include_router(events.router, max_body_size=settings.max_body_bytes)
    app.include_router(runs.router)
    app.include_router(metrics.router)
    _optional_auth(app, settings)
    return app
