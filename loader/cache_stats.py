"""What the processes of a node report about its cache: each writes its counts to
`<cache_dir>/stats/<pid>-<id>.json` (`NodeCache.write_stats`), and any of them adds the
node's up (`node_stats`) for the `cache` telemetry event."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_STARTED = time.time()


@dataclass
class CacheCounts:
    """This process's use of the cache (sent in telemetry, served in /metrics)."""

    hits: int = 0
    misses: int = 0
    bytes_from_store: int = 0
    bytes_from_cache: int = 0
    evictions: int = 0
    refetched: int = 0  # a cached file found damaged or missing, fetched again
    prefetched: int = 0  # files the prefetcher fetched before a read needed them
    prefetch_lead: int | None = None  # gauge: batches ahead the prefetched files reach

    def as_dict(self) -> dict[str, int | None]:
        return dict(self.__dict__)


GAUGES = ("prefetch_lead",)  # a process's present value, never summed


def node_stats(root: str, since: float = _STARTED) -> dict[str, int | None]:
    """The node's totals: every process's counts written since `since` (this one's start),
    so ranks, their workers and the ones before them in this job add up. `prefetch_lead`
    is the smallest lead among the node's live processes that prefetch (None: none does);
    a dead process's last file never holds it."""
    total = CacheCounts().as_dict()
    leads: list[int] = []
    for path in (Path(root) / "stats").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            if path.stat().st_mtime < since:
                continue
            counts = json.loads(path.read_text())
            for key, value in counts.items():
                if key in total and key not in GAUGES and _is_int(value):
                    total[key] = (total[key] or 0) + value
            lead = counts.get("prefetch_lead")
            if _is_int(lead) and _alive(int(path.name.split("-", 1)[0])):
                leads.append(lead)
    total["prefetch_lead"] = min(leads) if leads else None
    return total


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (the node's processes share a PID namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
