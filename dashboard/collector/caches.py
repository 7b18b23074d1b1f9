"""The node cache panel: per node (host) and cache folder, what its latest `cache` report
says — hit rate, bytes from the store vs from the cache, evictions, files fetched again,
the prefetcher's lead — and a plain sentence for what is wrong.

Every figure is the node's total since its loader started (the report's counters): a
report carries no epoch, and retention keeps only the latest ones, so a share "this epoch"
could not be computed honestly and is not shown. A report older than `STALE_S` is marked
with when it was received (the collector's clock).
"""

from __future__ import annotations

from typing import Any

from dashboard.collector.store import Store

COUNTERS = (
    "hits", "misses", "bytes_from_store", "bytes_from_cache", "evictions", "refetched",
    "prefetched",
)  # fmt: skip
STALE_S = 30.0  # reports come every 5 s (loader.telemetry.reporter.CACHE_EVERY_S)
STORE_SHARE_WARN = 0.25  # a warm cache reads far less than this from the store


def _count(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def lead(data: dict[str, Any]) -> float | None:
    """The prefetcher's lead in steps; None when the sender has no prefetcher (or is older)."""
    value = data.get("prefetch_lead")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def node(data: dict[str, Any], now: float) -> dict[str, Any]:
    """One node cache's row: its counters, the shares derived from them, its warnings."""
    row: dict[str, Any] = {
        "host": str(data.get("host", "")),
        "cache_dir": str(data.get("cache_dir", "")),
    }
    row.update({key: _count(data, key) for key in COUNTERS})
    row["prefetch_lead"] = lead(data)
    reads = (row["hits"] or 0) + (row["misses"] or 0)
    row["hit_rate"] = (row["hits"] or 0) / reads if reads else None
    moved = (row["bytes_from_store"] or 0) + (row["bytes_from_cache"] or 0)
    row["store_share"] = (row["bytes_from_store"] or 0) / moved if moved else None
    row["received_ts"] = data["recv"]
    row["age_s"] = max(0.0, now - data["recv"])
    row["stale"] = row["age_s"] > STALE_S
    row["warnings"] = warnings(row)
    return row


def warnings(row: dict[str, Any]) -> list[str]:
    """What a person should know about one node cache, in plain words; [] when all is well."""
    out = []
    where = f"{row['host']} ({row['cache_dir']})"
    share = row["store_share"]
    if share is not None and share >= STORE_SHARE_WARN:
        out.append(
            f"{where} fetched {share * 100:.0f} % of its bytes from the store (expected of a "
            "cold cache in its first epoch; after it, the cache may be too small for the "
            "data: see cache_limit)"
        )
    refetched = row["refetched"] or 0
    if refetched:
        files = "a cached file was" if refetched == 1 else f"{refetched:,} cached files were"
        out.append(f"{where}: {files} damaged or missing and fetched again")
    return out


def caches(store: Store, run: dict[str, Any], now: float) -> dict[str, Any]:
    """The run's node caches, by host and folder; `nodes` is empty for a run without one."""
    nodes = [node(data, now) for data in store.latest_caches(run["run_id"])]
    return {"run_id": run["run_id"], "nodes": nodes, "stale_after_s": STALE_S}
