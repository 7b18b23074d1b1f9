"""How a batch of events reaches the collector: one POST, and what a failure means.

Kept apart from the client so the HTTP details (no proxies, no redirects, the collector's
refusals read back into the one warning) and the back-off live in one place; the client
decides what to send and counts what was sent or dropped. A failed POST is never retried
here: telemetry is lossy by design (see `loader/telemetry/client.py`).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import warnings
from typing import Any

import orjson

MAX_BACKOFF_S = 30.0  # a dead collector is tried this rarely, at most


class TelemetryWarning(RuntimeWarning):
    """Issued once per client when events start being dropped; filter it to silence it."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse every redirect: following one would re-send the bearer token elsewhere."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        raise urllib.error.HTTPError(
            req.full_url, code, f"redirect to {newurl} not followed", headers, fp
        )


class Transport:
    """POSTs event batches to one endpoint and backs off (doubling to 30 s) after a failure."""

    def __init__(self, endpoint: str, token: str | None, interval_s: float) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        # No proxies: a cluster-local collector reached through $http_proxy would be a surprise.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self.transient = True  # the last failure may pass on a retry
        self._warned = False
        self._retry_at = 0.0
        self._backoff_s = interval_s

    def backing_off(self) -> bool:
        """Is this a moment to skip a regular send (a recent failure)?"""
        return time.monotonic() < self._retry_at

    def post(self, events: list[dict[str, Any]], timeout_s: float) -> None:
        """Send `events` in one request; raises what urllib, http.client or orjson raise."""
        body = orjson.dumps({"events": events})
        request = urllib.request.Request(self.endpoint, body, self._headers, method="POST")
        with self._opener.open(request, timeout=timeout_s) as response:
            response.read()

    def succeeded(self) -> None:
        self._backoff_s = self.interval_s
        self._retry_at = 0.0

    def failed(self, exc: BaseException) -> None:
        """Back off so a dead collector costs nothing; warn the first time only."""
        # a refusal (4xx but 429) would be refused again: only the rest is worth a retry
        code = exc.code if isinstance(exc, urllib.error.HTTPError) else None
        self.transient = code is None or code == 429 or code >= 500
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, MAX_BACKOFF_S)
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"elastic-loader telemetry: cannot reach {self.endpoint} ({_reason(exc)}); "
                "dropping events until it answers (retried up to 30 s apart), training continues",
                TelemetryWarning,
                stacklevel=2,
            )


def _reason(exc: BaseException) -> str:
    """What went wrong, with the collector's own explanation of a 4xx when it gave one."""
    if not isinstance(exc, urllib.error.HTTPError) or exc.fp is None:
        return str(exc)
    try:
        detail = orjson.loads(exc.read(16384)).get("detail")
    except Exception:  # not our collector's JSON: the status line says enough
        return str(exc)
    if isinstance(detail, list):  # a 422: each refused field, where and why
        detail = "; ".join(_refusal(d) for d in detail[:3] if isinstance(d, dict))
    return f"{exc}: {detail}" if isinstance(detail, str) and detail else str(exc)


def _refusal(error: dict[str, Any]) -> str:
    """'events.0.data.names: ...' from one of FastAPI's validation errors."""
    where = ".".join(str(p) for p in error.get("loc") or [] if p != "body")
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))
