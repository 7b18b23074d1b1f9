"""The throughput view: rows/s across ranks as a band, stragglers, the input-bound verdict.

Kept apart from `views.py` (placement, progress) and `timeline.py`: it is the one view with a
cache. Band points of buckets that ended `SETTLED_S` before a run's last report are final;
a `SettledBands` computes them once per (run, bucket size) and serves them from memory. The
collector app owns one (`app.state.bands`), so the cache lives and dies with its app and
its database, not with the process.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from dashboard.collector.status import DEFAULT_HEALTH, Health, ranks_text, run_status
from dashboard.collector.store import ROLLUP_S, Store
from dashboard.collector.timeline import resume_crashes
from dashboard.placement import RankRate, stragglers

MAX_POINTS = 2000
STRAGGLER_WINDOW_S = 30.0
SAMPLE_BUDGET = 40_000  # per-second sample rows one throughput query may group
SETTLED_S = 30.0  # buckets this much older than the last report are final (and cached)
SLOWEST = 5
INPUT_BOUND = 0.10  # a loop that waits for data this share of its step time is input-bound


class SettledBands:
    """Band points of settled buckets per (run, first report, bucket size), most recently
    used last, at most `most` entries."""

    def __init__(self, most: int = 64) -> None:
        self.most = most
        self._entries: dict[tuple[Any, ...], dict[str, Any]] = {}

    def points(
        self, store: Store, run: dict[str, Any], since: float, bucket: int
    ) -> dict[float, Any]:
        """Band points of buckets that ended `SETTLED_S` before the run's last report."""
        key = (run["run_id"], run["first_ts"], bucket)
        entry = self._entries.pop(key, None)
        if entry is None or since < entry["from"]:
            entry = {"from": since, "to": since, "points": {}}
        self._entries[key] = entry
        while len(self._entries) > self.most:
            self._entries.pop(next(iter(self._entries)))
        horizon = run["last_ts"] - SETTLED_S
        if entry["to"] < horizon - bucket:
            rows = store.series(run["run_id"], entry["to"], bucket)
            done = [r for r in rows if r[1] + bucket <= horizon]
            entry["points"].update((p["t"], p) for p in _band(done))
            entry["to"] = max((p + bucket for p in entry["points"]), default=entry["to"])
        return {t: p for t, p in entry["points"].items() if t >= since - bucket}


def _bucket_s(window_s: float, points: int) -> int:
    """Window ÷ points, in whole seconds and, from 10 s up, whole rollup buckets."""
    bucket = max(1, math.ceil(window_s / max(1, min(points, MAX_POINTS))))
    return 10 * math.ceil(bucket / 10) if bucket >= 10 else bucket


def throughput(
    store: Store,
    run: dict[str, Any],
    window_s: float,
    points: int,
    health: Health = DEFAULT_HEALTH,
    bands: SettledBands | None = None,
) -> dict[str, Any]:
    """Rows/s across ranks as a band (median, min, max per time bucket) over the last
    `window_s`, the slowest ranks of the last 30 s, stragglers and the input-bound verdict.

    A band, not one line per rank: at 1,024 ranks lines are unreadable and 100,000 points
    to ship every second. A bucket in which no rank reported starts a new `segment`, so no
    line is drawn across an outage. Buckets grow to the 10 s rollup when the window's
    per-second samples would exceed `SAMPLE_BUDGET` rows, and buckets older than
    `SETTLED_S` are computed once and kept in `bands` (the app's `SettledBands`; without
    one, every bucket is computed): each refresh reads only the last half minute, which
    keeps the query under 50 ms at 1,024 ranks.
    """
    since = run["last_ts"] - window_s
    bucket = _bucket_s(window_s, points)
    if bucket < ROLLUP_S and window_s * max(1, run["ranks"]) > SAMPLE_BUDGET:
        bucket = ROLLUP_S
    settled = (bands or SettledBands()).points(store, run, since, bucket)
    fresh_from = max(since, max(settled, default=since - bucket) + bucket)
    band = {p["t"]: p for p in _band(store.series(run["run_id"], fresh_from, bucket))}
    points_in = sorted({**settled, **band}.items())
    totals = store.rank_totals(
        run["run_id"], run["last_ts"] - STRAGGLER_WINDOW_S, run["world_size"]
    )
    recent = _recent(totals)
    status = run_status(store, run, health=health)
    silent = [r["last_ts"] for r in status["ranks"] if r["state"] == "crashed"]
    return {
        "run_id": run["run_id"],
        "crashed_at": max(silent) if silent else None,
        "crashed_before": resume_crashes(store, run),
        "bucket_s": float(bucket),
        "band": _segments([p for _, p in points_in], bucket),
        "count": len(points_in),
        "slowest": [
            {"rank": r.rank, "rows_per_s": r.rows_per_s, "wait_share": r.stall_frac}
            for r in sorted(recent, key=lambda r: r.rows_per_s)[:SLOWEST]
        ],
        "stragglers": _stragglers(recent),
        "input": input_bound(recent),
        "tokens_per_s": _tokens_per_s(run, totals),
    }


def _segments(band: list[dict[str, Any]], bucket: int) -> list[dict[str, Any]]:
    """Number the runs of consecutive buckets: a missing bucket starts the next segment."""
    segment = 0
    for before, point in zip([None, *band], band, strict=False):
        if before is not None and point["t"] - before["t"] > bucket:
            segment += 1
        point["segment"] = segment
    return band


def _band(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Median, min and max rows/s (and wait share) across ranks, per time bucket."""
    _, t, done, _, wait, covered = np.array(rows, dtype=float).reshape(-1, 6).T
    covered = np.maximum(covered, 1e-9)
    rate, share = done / covered, np.minimum(1.0, wait / covered)
    times, counts = np.unique(t, return_counts=True)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    rate_s, share_s = rate[np.lexsort((rate, t))], share[np.lexsort((share, t))]
    band: list[dict[str, Any]] = []
    for i, (when, n) in enumerate(zip(times, counts, strict=True)):
        r, w = rate_s[offsets[i] : offsets[i] + n], share_s[offsets[i] : offsets[i] + n]
        band.append({"t": float(when), "segment": 0, "ranks": int(n)})
        band[-1].update(median=float(np.median(r)), min=float(r[0]), max=float(r[-1]))
        band[-1].update(wait_median=float(np.median(w)), wait_max=float(w[-1]))
    return band


def _recent(totals: list[Any]) -> list[RankRate]:
    """Each rank's rows/s and wait share from its `Store.rank_totals` of the last 30 s."""
    return [
        RankRate(
            r["rank"], r["rows"] / (r["iv"] or 1e-9), min(1.0, r["wait_s"] / (r["iv"] or 1e-9))
        )
        for r in totals
    ]


def _tokens_per_s(run: dict[str, Any], totals: list[Any]) -> float | None:
    """Packed data: the job's tokens/s over the last 30 s (each rank's tokens ÷ its covered
    seconds, summed over ranks); None for row data."""
    if run.get("seq_len") is None:
        return None
    return float(sum((r["tokens"] or 0) / (r["iv"] or 1e-9) for r in totals))


def _stragglers(rates: list[RankRate]) -> list[dict[str, Any]]:
    """Ranks of the current world that lag the median over the last 30 s."""
    return [
        {"rank": r.rank, "rows_per_s": r.rows_per_s, "stall_frac": r.stall_frac, "reason": why}
        for r, why in zip(rates, stragglers(rates), strict=True)
        if why
    ]


def input_bound(rates: list[RankRate]) -> dict[str, Any]:
    """Is the GPU waiting on data? The share of step time each rank's training loop spent
    waiting for its next batch (the loader's `wait_s` ÷ the interval), and a verdict."""
    if not rates:
        return {"job_share": None, "ranks": [], "bound": [], "verdict": "no reports yet"}
    job = statistics.median(r.stall_frac for r in rates)
    bound = sorted(r.rank for r in rates if r.stall_frac >= INPUT_BOUND)
    if job >= INPUT_BOUND:
        verdict = f"input-bound: the median rank waits for data {job:.0%} of its step time"
    elif bound:
        verdict = f"input-bound on rank{'s' if len(bound) > 1 else ''} {ranks_text(bound)}"
    else:
        verdict = f"not input-bound: ranks wait for data {job:.0%} of their step time (median)"
    worst = sorted(rates, key=lambda r: -r.stall_frac)[:SLOWEST]
    return {
        "job_share": job,
        "ranks": [{"rank": r.rank, "wait_share": r.stall_frac} for r in worst],
        "bound": bound,
        "verdict": verdict,
    }
