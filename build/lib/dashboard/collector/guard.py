"""Who may talk to the collector at all, checked on every request before any route runs.

Two rules, both enforced where the facts are known rather than trusted from configuration:

- **Local address.** Without a token the collector serves only connections that arrive on
  the address it was started for (`Settings.host`; `localhost` means 127.0.0.1 and ::1).
  The ASGI scope's `server` is the socket's own address, so
  `uvicorn --factory dashboard.collector.main:create_app --host 0.0.0.0` without a token
  answers a connection from another machine (it arrives on a non-loopback address) with 403.
- **Host header** (DNS rebinding): a browser tricked into sending a page's requests to
  127.0.0.1 still sends the attacker's name as `Host`; only the loopback names, the
  configured host and `Settings.allowed_hosts` are accepted (400 otherwise). On a wildcard
  bind the machine's hostname and any IP literal are accepted too (an IP is no rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from dashboard.collector.config import WILDCARDS, Settings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address, IPv4-mapped IPv6 (a dual-stack socket's view of IPv4) as IPv4; or None."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def host_name(header: str) -> str:
    """The name in a Host header, lower-case, without port, brackets or a trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else ""
    if header.count(":") > 1:  # a bare IPv6 address is not a valid Host header
        return ""
    return header.split(":", 1)[0].rstrip(".")


class Guard:
    """What one settings object allows; `check` returns an HTTP error or None."""

    def __init__(self, settings: Settings) -> None:
        self.token = settings.token
        host = settings.host.strip("[]").lower()
        self.wildcard = host in WILDCARDS
        if host == "localhost":
            self.local_addresses = {_ip("127.0.0.1"), _ip("::1")}
        else:
            self.local_addresses = {_ip(host)}
        names = set(LOOPBACK_NAMES) | {host} | set(settings.allowed_hosts)
        if self.wildcard:
            names.add(socket.gethostname().lower())
        self.names = frozenset(names - {""})  # a request without a Host is never one of ours

    def address_allowed(self, server: tuple[str, int] | None) -> bool:
        if self.token or server is None:  # a token guards the API; a unix socket is local
            return True
        return _ip(str(server[0])) in self.local_addresses

    def host_allowed(self, header: str) -> bool:
        name = host_name(header)
        if name in self.names:
            return True
        ip = _ip(name)
        return ip is not None and (ip.is_loopback or self.wildcard)

    def check(self, scope: Scope) -> tuple[int, str] | None:
        if not self.address_allowed(scope.get("server")):
            where = scope["server"][0]
            return 403, (
                f"this collector has no token and serves only its own address, not {where}: "
                "restart it with --token (ELASTIC_LOADER_DASHBOARD_TOKEN) to accept other "
                "addresses"
            )
        headers = dict(scope.get("headers") or [])
        header = headers.get(b"host", b"").decode("latin-1")
        if not self.host_allowed(header):
            return 400, (
                f"Host {header!r} is not one this collector serves: use 127.0.0.1 or "
                "localhost, or add the name to ELASTIC_LOADER_DASHBOARD_ALLOWED_HOSTS"
            )
        return None


class GuardMiddleware:
    """Pure ASGI middleware applying `Guard` to every HTTP and WebSocket request."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.guard = Guard(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.guard.check(scope) if scope["type"] in ("http", "websocket") else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, detail = refused
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = orjson.dumps({"detail": detail})
        headers: list[Any] = [(b"content-type", b"application/json")]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
