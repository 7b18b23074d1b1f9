"""Turn stored rows into what the dashboard draws; each function answers one endpoint.

Kept apart from `store.py` (SQL only) and the routes (HTTP only) so the shaping — who owns
which split, epoch %, ETA, stragglers, resume labels — is plain Python that tests can call.
"""

from __future__ import annotations

import math
from typing import Any

from dashboard.collector.store import Store
from dashboard.placement import RankRate, owners, stragglers
from loader.layout import supported_world_sizes

MAX_POINTS = 2000
STRAGGLER_WINDOW_S = 30.0


def _layout(store: Store, run: dict[str, Any], world_size: int) -> dict[str, Any]:
    ranks = store.ranks(run["run_id"], world_size)
    return {
        "world_size": world_size,
        "owner": owners(world_size, run["num_splits"]),
        "ranks": ranks,
    }


def placement(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Current split → rank layout and, after a resume on another W, the one before."""
    prev = run["prev_world_size"]
    return {
        "run_id": run["run_id"],
        "num_splits": run["num_splits"],
        "supported_world_sizes": supported_world_sizes(run["num_splits"]),
        "current": _layout(store, run, run["world_size"]),
        "previous": _layout(store, run, prev) if prev else None,
    }


def progress(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Per-split cursors from each rank's latest report, epoch % and ETA at current speed."""
    num_splits, per_split = run["num_splits"], run["rows_per_split"]
    cursors: list[int | None] = [None] * num_splits
    ranks, epoch, rate = [], None, 0.0
    for r in store.ranks(run["run_id"], run["world_size"]):
        lo, hi = (r["splits"] or [0, 0])[:2]
        own = r["cursors"] or []
        if len(own) == hi - lo:
            cursors[lo:hi] = own
        done = sum(own)
        total = (hi - lo) * per_split
        pct = 100.0 * done / total if total else 0.0
        ranks.append({"rank": r["rank"], "epoch": r["epoch"], "step": r["step"]})
        ranks[-1].update(rows_done=done, rows_total=total, pct=pct)
        rate += r["rows_per_s"]
        if r["epoch"] is not None:
            epoch = max(epoch or 0, r["epoch"])
    rows_done = sum(c for c in cursors if c is not None)
    rows_total = num_splits * per_split
    left = rows_total - rows_done
    return {
        "run_id": run["run_id"],
        "epoch": epoch,
        "rows_per_split": per_split,
        "cursors": cursors,
        "owner": owners(run["world_size"], num_splits),
        "rows_done": rows_done,
        "rows_total": rows_total,
        "epoch_pct": 100.0 * rows_done / rows_total if rows_total else 0.0,
        "rows_per_s": rate,
        "eta_s": left / rate if rate > 0 else None,
        "ranks": ranks,
    }


def throughput(store: Store, run: dict[str, Any], window_s: float, points: int) -> dict[str, Any]:
    """Rows/s and data wait per rank over the last `window_s`, at most `points` per rank.

    The bucket is the window divided by `points`, rounded up to whole seconds and, from
    10 s up, to whole rollup buckets: a 64-rank hour at the default 120 points is 7,680
    samples, whatever the event rate was.
    """
    points = max(1, min(points, MAX_POINTS))
    since = run["last_ts"] - window_s
    bucket = max(1, math.ceil(window_s / points))
    if bucket >= 10:
        bucket = 10 * math.ceil(bucket / 10)
    data = []
    for row in store.series(run["run_id"], since, bucket):
        covered = row["interval_s"] or 1e-9
        data.append(
            {
                "rank": row["rank"],
                "t": float(row["t"]),
                "rows_per_s": row["rows"] / covered,
                "wait_per_step_s": row["wait_s"] / row["batches"] if row["batches"] else 0.0,
                "stall_frac": min(1.0, row["wait_s"] / covered),
            }
        )
    return {
        "run_id": run["run_id"],
        "bucket_s": float(bucket),
        "data": data,
        "count": len(data),
        "stragglers": _stragglers(store, run),
    }


def _stragglers(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Ranks of the current world that lag the median over the last 30 s."""
    since = run["last_ts"] - STRAGGLER_WINDOW_S
    rows = store.query(
        "SELECT rank, sum(rows) AS rows, sum(wait_s) AS wait_s, sum(interval_s) AS iv "
        "FROM samples WHERE run_id = ? AND ts >= ? AND rank < ? GROUP BY rank ORDER BY rank",
        run["run_id"],
        since,
        run["world_size"],
    )
    rates = [
        RankRate(
            r["rank"], r["rows"] / (r["iv"] or 1e-9), min(1.0, r["wait_s"] / (r["iv"] or 1e-9))
        )
        for r in rows
    ]
    return [
        {"rank": r.rank, "rows_per_s": r.rows_per_s, "stall_frac": r.stall_frac, "reason": why}
        for r, why in zip(rates, stragglers(rates), strict=True)
        if why
    ]


def timeline(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Checkpoints, resumes and epoch ends, one item per (kind, epoch, step, W) across ranks."""
    items: dict[tuple[Any, ...], dict[str, Any]] = {}
    for ev in store.events(run["run_id"], None, 10_000):
        before = ev["data"].get("world_size_before")
        before = before if isinstance(before, int) else None
        key = (ev["kind"], ev["epoch"], ev["step"], ev["world_size"], before)
        item = items.get(key)
        if item is None:
            item = items[key] = {"kind": ev["kind"], "ts": ev["ts"], "epoch": ev["epoch"]}
            item.update(step=ev["step"], world_size=ev["world_size"], world_size_before=before)
            item.update(
                ranks=0, label=_label(ev["kind"], ev["epoch"], ev["step"], ev["world_size"], before)
            )
        item["ranks"] += 1
    return sorted(items.values(), key=lambda item: item["ts"])


def _label(kind: str, epoch: int | None, step: int | None, world: int, before: int | None) -> str:
    at = f" at step {step:,}" if step is not None else ""
    if kind == "checkpoint_loaded":
        moved = f"W {before} → {world}" if before is not None else f"W {world}"
        return f"resumed: {moved}{at}"
    if kind == "checkpoint_saved":
        return f"checkpoint saved (W {world}){at}"
    if kind == "epoch_end":
        return f"epoch {epoch} ended{at}" if epoch is not None else f"epoch ended{at}"
    return f"{kind.replace('_', ' ')}{at}"
