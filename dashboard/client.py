"""The dashboard's one HTTP client to the collector (stdlib + orjson, no extra deps).

Pages never build URLs themselves: a changed route is changed here once. Errors become
`CollectorError` with the URL and reason, which the pages show instead of a traceback.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

from dashboard.env import ENV_API
from dashboard.env import ENV_TOKEN as ENV_API_TOKEN

__all__ = ["ENV_API", "ENV_API_TOKEN", "CollectorClient", "CollectorError"]


class CollectorError(RuntimeError):
    """The collector could not be reached or refused the request."""


def settings_from_env() -> tuple[str, str | None]:
    """The collector's URL and token, as the environment gives them."""
    return os.environ.get(ENV_API, "http://127.0.0.1:8765"), os.environ.get(ENV_API_TOKEN)


class CollectorClient:
    """Read-only access to one collector's JSON API."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 3.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @classmethod
    def from_env(cls) -> CollectorClient:
        return cls(*settings_from_env())

    def get(self, path: str, **params: Any) -> Any:
        query = {k: v for k, v in params.items() if v is not None}
        url = self.base_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, headers=self._headers)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as resp:
                return orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise CollectorError(f"{url}: HTTP {exc.code} {exc.read()[:200]!r}") from exc
        except (OSError, ValueError) as exc:
            raise CollectorError(f"{url}: {exc}") from exc

    def _run(self, run_id: str, view: str, **params: Any) -> Any:
        return self.get(f"/api/runs/{urllib.parse.quote(run_id, safe='')}/{view}", **params)

    def health(self) -> dict[str, Any]:
        return dict(self.get("/health"))

    def runs(self) -> list[dict[str, Any]]:
        return list(self.get("/api/runs")["data"])

    def status(self, run_id: str) -> dict[str, Any]:
        return dict(self._run(run_id, "status"))

    def placement(self, run_id: str) -> dict[str, Any]:
        return dict(self._run(run_id, "placement"))

    def progress(self, run_id: str) -> dict[str, Any]:
        return dict(self._run(run_id, "progress"))

    def throughput(self, run_id: str, window_s: float = 300, points: int = 120) -> dict[str, Any]:
        return dict(self._run(run_id, "throughput", window_s=window_s, points=points))

    def caches(self, run_id: str) -> dict[str, Any]:
        return dict(self._run(run_id, "caches"))

    def timeline(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._run(run_id, "timeline")["data"])

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        return list(self._run(run_id, "attempts")["data"])

    def events(self, run_id: str, kind: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self._run(run_id, "events", kind=kind, limit=limit)["data"])
