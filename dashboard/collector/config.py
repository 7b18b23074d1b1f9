"""The collector's settings, read once from the environment.

`pydantic-settings` is not a dependency, so this is a plain frozen pydantic model with an
explicit `from_env`; `launch.py` passes the same values to a subprocess through these names.
"""

from __future__ import annotations

import ipaddress
import os

from pydantic import BaseModel, ConfigDict, Field

from dashboard.collector.metrics import METRICS_KEEP_S
from dashboard.collector.status import Health
from dashboard.collector.store import Retention
from dashboard.env import (
    ENV_ALLOWED_HOSTS,
    ENV_DB,
    ENV_HOST,
    ENV_KEEP_DAYS,
    ENV_KEEP_RUNS,
    ENV_STALL_AFTER_S,
    ENV_TOKEN,
)

__all__ = ["ENV_DB", "ENV_HOST", "ENV_TOKEN", "Settings", "is_loopback"]
WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`: the only binds allowed without a token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _env_number(name: str, default: str) -> float:
    text = os.environ.get(name, default)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number (e.g. {name}={default})") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in text.split(",") if part.strip())


class Settings(BaseModel):
    """Where events live, who may send them, how much one request may carry, what is kept.

    `host` is the address the collector is served on: without a token, requests that
    arrive on any other local address are refused (see `guard.py`). `allowed_hosts` are
    extra names clients may use in the Host header (the loopback names and `host` are always
    allowed). Retention keeps the `keep_runs` most recently active runs and drops runs
    silent for `keep_days`; events older than `keep_days` are refused, and at most
    `new_runs_per_minute` runs may start in any minute (so spam cannot flush real runs out);
    raw samples are kept `keep_samples_s` per run (see `store.Retention`). A rank that
    reports but has not stepped for `stall_after_s` seconds is stalled (`status.Health`).
    """

    model_config = ConfigDict(frozen=True)

    db: str = "dashboard.db"
    token: str | None = None
    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = Field(default=4 << 20, gt=0)
    keep_runs: int = Field(default=100, ge=1)
    keep_days: float = Field(default=30.0, gt=0)
    max_clock_skew_s: float = Field(default=300.0, ge=0)
    keep_samples_s: float = Field(default=6 * 3600.0, ge=20_000)
    new_runs_per_minute: int = Field(default=60, ge=1)
    stall_after_s: float = Field(default=Health.no_step_s, gt=0)
    metrics_keep_s: float = Field(
        default=METRICS_KEEP_S, gt=0
    )  # /metrics: a run's time after its end

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            db=os.environ.get(ENV_DB, "dashboard.db"),
            token=os.environ.get(ENV_TOKEN) or None,
            host=os.environ.get(ENV_HOST, "127.0.0.1"),
            allowed_hosts=_names(os.environ.get(ENV_ALLOWED_HOSTS, "")),
            keep_runs=int(_env_number(ENV_KEEP_RUNS, "100")),
            keep_days=_env_number(ENV_KEEP_DAYS, "30"),
            stall_after_s=_env_number(ENV_STALL_AFTER_S, str(Health.no_step_s)),
        )

    def retention(self) -> Retention:
        return Retention(
            self.keep_runs, self.keep_days, self.keep_samples_s, self.new_runs_per_minute
        )

    def health(self) -> Health:
        return Health(no_step_s=self.stall_after_s)

    def check_bind(self) -> None:
        """Binding beyond loopback without a token would let anyone write into the DB."""
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"host={self.host!r} is not loopback: pass --token (or set {ENV_TOKEN}) "
                "so that only ranks holding it can send events"
            )
