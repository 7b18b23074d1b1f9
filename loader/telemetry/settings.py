"""Telemetry settings: the environment variables, the collector URL and run id checks, the
job's stated length (what `TelemetryClient.from_settings` takes, checked in one place)."""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse
from collections.abc import Mapping
from typing import Any

from loader.wire import RUN_ID

ENV_URL = "ELASTIC_LOADER_TELEMETRY"
ENV_RUN_ID = "ELASTIC_LOADER_RUN_ID"
ENV_TOKEN = "ELASTIC_LOADER_TELEMETRY_TOKEN"


def job_length(total_epochs: int | None, total_steps: int | None) -> dict[str, int]:
    """The static fields for a job's stated length; a bad value is a ValueError naming it."""
    out = {}
    for name, value in (("total_epochs", total_epochs), ("total_steps", total_steps)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{name} must be a positive int (how many the job will run), got {value!r}"
            )
        out[name] = value
    return out


def default_run_id(static: Mapping[str, Any]) -> str:
    """One id that every rank of a job computes alike, without talking (`job_identity`)."""
    return job_identity(static)[0]


def job_identity(static: Mapping[str, Any]) -> tuple[str, str]:
    """(the job, this attempt of it), from the launcher's own identity of the job:

    - torchrun's `TORCHELASTIC_RUN_ID` (`--rdzv-id`; `--standalone` draws a random one),
    - SLURM's `SLURM_JOB_ID`, Ray's job id (when this process already runs Ray),
    - plain torchrun on one node (its run id is "none"): its agent, the ranks' parent
      process, by pid and start time (two jobs never share one, its restarts do),
    - else `MASTER_ADDR-MASTER_PORT` (plain torchrun on several nodes, hand-made launchers:
      give them `--rdzv-id` or `ELASTIC_LOADER_RUN_ID`), or this host and process.

    The attempt is the job, with torchrun's restart count when the agent restarted it. A
    resume from a checkpoint joins the checkpoint's run (its lineage) as a new attempt."""
    host = str(static.get("host") or socket.gethostname())
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    job = _launcher_job(elastic, host)
    attempt = job if restart in ("", "0") else f"{job}-restart{restart}"
    return job, attempt


def _launcher_job(elastic: str, host: str) -> str:
    if elastic and elastic != "none":
        return elastic
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}"
    ray = sys.modules.get("ray")  # never imported here: only a process already in Ray
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return f"ray-{ray.get_runtime_context().get_job_id()}"
    one_node = os.environ.get("GROUP_WORLD_SIZE") == "1"
    if elastic == "none" and one_node:  # plain torchrun on one node: its agent is the job
        agent = os.getppid()
        return f"torchrun-{host}-{agent}-{_started(agent)}"
    port = os.environ.get("MASTER_PORT")
    addr = os.environ.get("MASTER_ADDR") or host
    return f"{addr}-{port}" if port else f"{host}-{os.getpid()}"


def _started(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, Linux), so a reused pid is
    another job; '0' where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


def check_url(url: str) -> str:
    """The collector's base URL without a trailing '/', or a ValueError saying what is wrong."""
    why = ""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is not a number in 0-65535
        if parts.scheme not in ("http", "https"):
            why = f"scheme {parts.scheme!r} is not http or https"
        elif not parts.hostname:
            why = "it names no host"
        elif port == 0:
            why = "port 0 cannot be connected to"
        elif parts.query or parts.fragment:
            why = "it has a query or fragment"
    except ValueError as exc:
        why = str(exc)
    if why:
        raise ValueError(
            f"Invalid telemetry URL {url!r}: {why}; give the collector's address, "
            "e.g. telemetry='http://127.0.0.1:8765' or ELASTIC_LOADER_TELEMETRY=http://node0:8765"
        )
    return url.rstrip("/")


def check_env(from_env: Mapping[str, bool], url: str, run_id: str) -> None:
    """ValueError naming the environment variable whose value the client would refuse."""
    for name, value, check in ((ENV_URL, url, check_url), (ENV_RUN_ID, run_id, check_run_id)):
        if from_env[name] and os.environ.get(name):
            try:
                check(value)
            except ValueError as exc:
                raise ValueError(f"${name}={value!r} is refused ({exc})") from None


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"Invalid telemetry run_id {run_id!r}: use 1-128 printable characters "
            "without '/' (e.g. ELASTIC_LOADER_RUN_ID=llama-run-7)"
        )
    return run_id
