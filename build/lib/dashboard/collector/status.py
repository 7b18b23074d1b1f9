"""Is the job alive? Run and rank state from heartbeats and progress, as W&B and Ray decide it.

Every rank's telemetry client sends a `progress` event every send interval (1 s by default)
and a `closed` event (with its reason) from `close()` and at the process's end. So a rank is:

- **running** when it reported within `Health.stalled_after` of its send intervals and its
  step moved within `Health.no_step_s` seconds,
- **stalled** when it has been silent longer than that (a long step holding the GIL), or
  reports without stepping (the heartbeat comes from a thread: a hung collective),
- **crashed** when silent for `Health.crashed_after` intervals without having closed, or
  when its `closed` says the process ended on an uncaught exception,
- **closed** when a `closed` event came after its last report. After `close()` (not at
  exit) the rank counts as running for `Health.rebuild_grace` intervals first: a loader
  rebuilt every epoch closes its client and the next one reports within an interval.

The send interval is the smaller of the rank's last two measured intervals: one heartbeat
after a long gap must not stretch every threshold by that gap. A silent rank whose last
report stands at an epoch end (the `epoch_end` it sent, nothing read since) finished when
the job's stated length is reached there, or (no length stated) when another rank closed at
that point: its own `closed` was lost. The run takes the worst state of the ranks of its
current world size: crashed, then stalled, then running; **finished** once every rank
closed after its last epoch (or the job said no total), **stopped** when they all closed
before the job's stated total or a rank of the world never reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dashboard.collector.store import Closed, Store
from loader.wire import CLOSE_REASON_CLOSE, CLOSE_REASON_ERROR

DEFAULT_INTERVAL_S = 1.0
WORST_FIRST = ("crashed", "stalled", "running", "closed")


@dataclass(frozen=True)
class Health:
    """The thresholds: silence in send intervals; a stuck step in seconds (`no_step_s`,
    settable: `--stall-after`, `ELASTIC_LOADER_DASHBOARD_STALL_AFTER_S`)."""

    stalled_after: float = 5
    crashed_after: float = 15
    no_step_s: float = 120.0
    rebuild_grace: float = 3


DEFAULT_HEALTH = Health()


def interval_of(rank: dict[str, Any]) -> float:
    """The rank's send interval: the smaller of its last two measured ones (0.1-60 s)."""
    last = rank.get("interval_s") or DEFAULT_INTERVAL_S
    before = rank.get("prev_interval_s") or last
    return min(60.0, max(0.1, min(last, before)))


def position(rank: dict[str, Any]) -> int | None:
    """The rank's step: the global one (clients older than it send the epoch's only)."""
    return rank["global_step"] if rank.get("global_step") is not None else rank.get("step")


def completed_epochs(rank: dict[str, Any]) -> int:
    """Epochs the rank finished: the `epoch_end`s it sent, or else the epoch it stands in."""
    return max(rank.get("epochs_done") or 0, rank.get("epoch") or 0)


def rank_state(
    rank: dict[str, Any], closed: Closed | None, now: float, health: Health = DEFAULT_HEALTH
) -> tuple[str, str | None]:
    """The rank's state and why: `silent`, `no step`, `error` (or None)."""
    interval = interval_of(rank)
    if closed is not None and closed.ts >= rank["ts"]:
        if closed.reason == CLOSE_REASON_ERROR:
            return "crashed", "error"
        rebuilding = closed.reason == CLOSE_REASON_CLOSE
        if rebuilding and now - closed.ts < health.rebuild_grace * interval:
            return "running", None
        return "closed", None
    silent = now - rank["ts"]
    if silent > health.crashed_after * interval:
        return "crashed", "silent"
    if silent > health.stalled_after * interval:
        return "stalled", "silent"
    if now - (rank.get("step_ts") or rank["ts"]) > health.no_step_s:
        return "stalled", "no step"
    return "running", None


def _reached(run: dict[str, Any], rank: dict[str, Any]) -> bool:
    """Did the rank get to the job's stated length (True when it stated none)?"""
    total_epochs, total_steps = run.get("total_epochs"), run.get("total_steps")
    if total_steps:
        return (position(rank) or 0) >= total_steps
    if total_epochs:
        return completed_epochs(rank) >= total_epochs
    return True


def _at_epoch_end(rank: dict[str, Any]) -> bool:
    return rank.get("end_step") is not None and rank["end_step"] == position(rank)


def _lost_close(run: dict[str, Any], rank: dict[str, Any], closed_epochs: list[int]) -> bool:
    """A silent rank that stopped where the job ended: its `closed` was lost, not its life."""
    if not _at_epoch_end(rank):
        return False
    if run.get("total_epochs") or run.get("total_steps"):
        return _reached(run, rank)
    return bool(closed_epochs) and completed_epochs(rank) >= max(closed_epochs)


def run_status(
    store: Store,
    run: dict[str, Any],
    ranks: list[dict[str, Any]] | None = None,
    health: Health = DEFAULT_HEALTH,
    now: float | None = None,
) -> dict[str, Any]:
    """The run's state, each rank's state and silence (from `ranks` if the caller read them)."""
    now = time.time() if now is None else now
    if ranks is None:
        ranks = store.heartbeats(run["run_id"], run["world_size"])
    # a `closed` that counts came after the rank's last report
    since = min((r["ts"] for r in ranks), default=run["last_ts"])
    closed = store.closed_ranks(run["run_id"], run["world_size"], since)
    judged = [(r, *rank_state(r, closed.get(r["rank"]), now, health)) for r in ranks]
    closed_epochs = [completed_epochs(r) for r, state, _ in judged if state == "closed"]
    states = []
    counts = dict.fromkeys(WORST_FIRST, 0)
    for r, state, why in judged:
        if why == "silent" and _lost_close(run, r, closed_epochs):
            state, why = "closed", None
        counts[state] += 1
        silent = now - r["ts"]
        error = closed[r["rank"]].error if why == "error" else None
        states.append(
            {"rank": r["rank"], "state": state, "silent_s": silent if silent > 0 else 0.0,
             "last_ts": r["ts"], "global_step": position(r), "why": why, "error": error,
             "no_step_s": max(0.0, now - (r.get("step_ts") or r["ts"]))}
        )  # fmt: skip
    missing = max(0, run["world_size"] - len(ranks))
    if not states:
        state = "starting"
    elif counts["closed"] == len(states):
        done = not missing and all(_reached(run, r) for r in ranks)
        state = "finished" if done else "stopped"
    else:
        state = next(s for s in WORST_FIRST if counts[s])
    return {
        "state": state,
        "resumed": run.get("prev_world_size") is not None or run.get("resumed_ts") is not None,
        "now": now,
        "last_ts": max((r["ts"] for r in ranks), default=run["last_ts"]),
        "counts": counts,
        "missing": missing,
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


def _who(bad: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> str:
    if len(bad) == len(ranks):
        return "every rank"
    return f"rank{'s' if len(bad) > 1 else ''} {ranks_text([r['rank'] for r in bad])}"


def _trouble(state: str, ranks: list[dict[str, Any]]) -> str:
    """'Crashed: rank 0 ended on an uncaught ValueError', '…silent for 41 s', '…no step'."""
    bad = [r for r in ranks if r["state"] == state]
    errors = [r for r in bad if r["why"] == "error"]
    if errors:
        kinds = ", ".join(sorted({r["error"] or "exception" for r in errors}))
        return f"Crashed: {_who(errors, ranks)} ended on an uncaught {kinds}"
    silent = [r for r in bad if r["why"] == "silent"]
    if silent:
        quiet = min(r["silent_s"] for r in silent)
        verb = "stopped reporting without closing" if state == "crashed" else "not reporting"
        return f"{state.capitalize()}: {_who(silent, ranks)} {verb}, silent for {quiet:,.0f} s"
    stuck = min(r["no_step_s"] for r in bad)
    return f"Stalled: {_who(bad, ranks)} reporting, but no step for {stuck:,.0f} s"


def headline(
    state: str, ranks: list[dict[str, Any]], counts: dict[str, int], world_size: int
) -> str:
    """One sentence a person reads first: e.g. 'Crashed: ranks 0, 1 silent for 41 s'."""
    if state == "starting":
        return f"Starting: none of the {world_size} ranks has reported yet"
    if state in ("crashed", "stalled"):
        return _trouble(state, ranks)
    every = "the rank" if len(ranks) == 1 else f"all {len(ranks):,} ranks"
    if state == "finished":
        return f"Finished: {every} closed"
    if state == "stopped" and len(ranks) < world_size:
        seen = {r["rank"] for r in ranks}
        never = [r for r in range(world_size) if r not in seen]
        who = f"rank{'s' if len(never) > 1 else ''} {ranks_text(never)}"
        return f"Stopped: {every} that reported closed; {who} never reported"
    if state == "stopped":
        return f"Stopped: {every} closed before the job's stated end"
    return f"Running: {counts['running']:,} of {world_size:,} ranks reporting"
