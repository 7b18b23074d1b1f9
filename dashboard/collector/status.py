"""Is the job alive? Run and rank state from heartbeats, the way W&B and Ray decide it.

Every rank's telemetry client sends a `progress` event every send interval (1 s by default)
and a `closed` event from `close()` and at interpreter exit. So a rank is:

- **running** when it reported within `STALLED_AFTER` of its own send intervals,
- **stalled** when it has been silent longer than that (a long step, a hung collective),
- **crashed** when silent for `CRASHED_AFTER` intervals without having closed,
- **closed** when its last `closed` event came at the end of its reports.

The run takes the worst state of the ranks of its current world size: crashed, then
stalled, then running; **finished** once every rank closed after its last epoch (or the
job said no total), **stopped** when they all closed before the job's stated total.
"""

from __future__ import annotations

import time
from typing import Any

from dashboard.collector.store import Store

STALLED_AFTER = 5
CRASHED_AFTER = 15
DEFAULT_INTERVAL_S = 1.0
WORST_FIRST = ("crashed", "stalled", "running", "closed")


def interval_of(rank: dict[str, Any]) -> float:
    """The rank's own send interval as measured by its last progress event (0.1-60 s)."""
    return min(60.0, max(0.1, rank.get("interval_s") or DEFAULT_INTERVAL_S))


def rank_state(rank: dict[str, Any], closed_ts: float | None, now: float) -> str:
    interval = interval_of(rank)
    if closed_ts is not None and closed_ts >= rank["ts"] - 2 * interval:
        return "closed"
    silent = now - rank["ts"]
    if silent <= STALLED_AFTER * interval:
        return "running"
    return "stalled" if silent <= CRASHED_AFTER * interval else "crashed"


def _finished(run: dict[str, Any], ranks: list[dict[str, Any]]) -> bool:
    """All ranks closed: did they reach the job's stated total (if it stated one)?"""
    total_epochs, total_steps = run.get("total_epochs"), run.get("total_steps")
    if total_steps:
        return any((r.get("global_step") or 0) >= total_steps for r in ranks)
    if total_epochs:
        return any((r.get("epoch") or 0) + 1 >= total_epochs for r in ranks)
    return True


def run_status(
    store: Store, run: dict[str, Any], ranks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The run's state, each rank's state and silence (from `ranks` if the caller read them)."""
    now = time.time()
    if ranks is None:
        ranks = store.heartbeats(run["run_id"], run["world_size"])
    # a `closed` that counts is at most 2 intervals (≤ 120 s) older than the rank's last report
    since = min((r["ts"] for r in ranks), default=run["last_ts"]) - 120
    closed = store.closed_ranks(run["run_id"], run["world_size"], since)
    states = []
    counts = dict.fromkeys(WORST_FIRST, 0)
    for r in ranks:
        state = rank_state(r, closed.get(r["rank"]), now)
        counts[state] += 1
        # clients older than the global step send the epoch's step only
        step = r["global_step"] if r.get("global_step") is not None else r.get("step")
        silent = now - r["ts"]
        states.append(
            {"rank": r["rank"], "state": state, "silent_s": silent if silent > 0 else 0.0,
             "last_ts": r["ts"], "global_step": step}
        )  # fmt: skip
    if not states:
        state = "starting"
    elif counts["closed"] == len(states):
        state = "finished" if _finished(run, ranks) else "stopped"
    else:
        state = next(s for s in WORST_FIRST if counts[s])
    return {
        "state": state,
        "resumed": run.get("prev_world_size") is not None,
        "now": now,
        "last_ts": max((r["ts"] for r in ranks), default=run["last_ts"]),
        "counts": counts,
        "missing": max(0, run["world_size"] - len(ranks)),
        "ranks": states,
        "headline": headline(state, states, counts, run["world_size"]),
    }


def public(status: dict[str, Any], most: int = 64) -> dict[str, Any]:
    """What every page's status line fetches each second: the silent ranks (worst first, at
    most `most`) rather than all 1,024."""
    order = {s: i for i, s in enumerate(WORST_FIRST)}
    silent = [r for r in status["ranks"] if r["state"] in ("crashed", "stalled")]
    silent.sort(key=lambda r: (order[r["state"]], -r["silent_s"], r["rank"]))
    return {**status, "ranks": silent[:most]}


def ranks_text(ranks: list[int], most: int = 8) -> str:
    """'3, 17' or '0, 1, …, 7 and 1,016 more': rank lists that stay one line at 1,024 ranks."""
    shown = ", ".join(str(r) for r in ranks[:most])
    return shown + (f" and {len(ranks) - most:,} more" if len(ranks) > most else "")


def headline(
    state: str, ranks: list[dict[str, Any]], counts: dict[str, int], world_size: int
) -> str:
    """One sentence a person reads first: e.g. 'Crashed: ranks 0, 1 silent for 41 s'."""
    if state == "starting":
        return f"Starting: none of the {world_size} ranks has reported yet"
    if state in ("crashed", "stalled"):
        bad = [r for r in ranks if r["state"] == state]
        silent = min(r["silent_s"] for r in bad)
        who = (
            "every rank"
            if len(bad) == len(ranks)
            else f"ranks {ranks_text([r['rank'] for r in bad])}"
        )
        verb = "stopped reporting without closing" if state == "crashed" else "not reporting"
        return f"{state.capitalize()}: {who} {verb}, silent for {silent:,.0f} s"
    every = "the rank" if len(ranks) == 1 else f"all {len(ranks):,} ranks"
    if state == "finished":
        return f"Finished: {every} closed"
    if state == "stopped":
        return f"Stopped: {every} closed before the job's stated end"
    return f"Running: {counts['running']:,} of {world_size:,} ranks reporting"
