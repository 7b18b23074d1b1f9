"""The collector's settings, read once from the environment.

`pydantic-settings` is not a dependency, so this is a plain frozen pydantic model with an
explicit `from_env`; `launch.py` passes the same values to a subprocess through these names.
"""

from __future__ import annotations

import ipaddress
import os

from pydantic import BaseModel, ConfigDict, Field

ENV_DB = "ELASTIC_LOADER_DASHBOARD_DB"
ENV_TOKEN = "ELASTIC_LOADER_DASHBOARD_TOKEN"
ENV_HOST = "ELASTIC_LOADER_DASHBOARD_HOST"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`: the only binds allowed without a token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseModel):
    """Where events live, who may send them, and how much one request may carry."""

    model_config = ConfigDict(frozen=True)

    db: str = "dashboard.db"
    token: str | None = None
    host: str = "127.0.0.1"
    max_body_bytes: int = Field(default=1 << 20, gt=0)

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            db=os.environ.get(ENV_DB, "dashboard.db"),
            token=os.environ.get(ENV_TOKEN) or None,
            host=os.environ.get(ENV_HOST, "127.0.0.1"),
        )

    def check_bind(self) -> None:
        """Binding beyond loopback without a token would let anyone write into the DB."""
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"host={self.host!r} is not loopback: pass --token (or set {ENV_TOKEN}) "
                "so that only ranks holding it can send events"
            )
