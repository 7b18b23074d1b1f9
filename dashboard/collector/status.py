"""Is the job alive? Run and process state from heartbeats, steps and `closed` events: the
one owner of the status rules (stated as a table in docs/dashboard.md, "Status rules").

Every process's telemetry client sends a `progress` event every `heartbeat_s` (1 s by
default: the heartbeat, from a thread) and a `closed` event with its reason from `close()`,
at the process's end and on SIGTERM. The thresholds count in the rank's **beat**: the
smaller of its last two measured send intervals (one heartbeat after a long gap must not
stretch them), never below the client's own `heartbeat_s` (an event sent at once, e.g. a
checkpoint's, makes a short interval that is not a heartbeat). A rank is:

- **running** while it reports and steps;
- **stalled** when silent for more than `stalled_after` beats, or reporting without its step
  moving for longer than its step limit: `step_factor` times the usual time between moves of
  its step (a decaying maximum), never below `no_step_floor` beats, never above `no_step_s`
  (`--stall-after`), and `no_step_s` before its first move or at an epoch end (an
  evaluation between epochs is not a hang);
- **crashed** when silent for more than `crashed_after` beats without a `closed`, when its
  `closed` says the process ended on an uncaught exception, or, once another process was
  terminated, when it has been silent `killed_after` beats and last reported before that
  termination (it was killed: it is why the others were terminated);
- **terminated** when its `closed` says a signal ended it (reason `terminated`), read
  "terminated after rank N died" when a process died first;
- **closed** when a `closed` came after its last report (after `close()`, not at exit, it
  counts as running for `rebuild_grace` beats: a loader rebuilt every epoch).

Silence is measured on the collector's clock of receipt: the collector stamps every event
with the time it received it, a process's silence runs from the receipt of its last report
and its step's from the receipt of its last move, and who died first is decided by receipt.
The sender's `ts` and `sent_ts` only order events and place them on the timeline: a clock
that is skewed, stepped back, ahead or at 0 neither hides nor invents a silence (rows stored
before receipts were kept fall back to `ts` shifted by the measured clock offset). Hysteresis: a state is entered only after
its condition held for its whole threshold and left only on proof (a report ends a silence,
a moved step ends a no-step stall), and the thresholds are those measured before the silence
began, so a silence never moves its own threshold.

The run takes the worst state of the processes of its current world (crashed, stalled,
running); **restarted** when processes were terminated by a torchrun agent with restarts
left (a planned restart); **finished** once every process closed after its last epoch (or
the job stated no length), **stopped** when they closed or were terminated before the job's
stated end, or a rank of the world never reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dashboard.collector.headline import headline, process_name, ranks_text, replicas_text
from dashboard.collector.store import Closed, Store
from loader.wire import CLOSE_REASON_CLOSE, CLOSE_REASON_ERROR, CLOSE_REASON_TERMINATED

__all__ = ["DEFAULT_HEALTH", "Health", "headline", "ranks_text", "replicas_text", "run_status"]

DEFAULT_INTERVAL_S = 1.0
MIN_BEAT_S, MAX_BEAT_S = 0.1, 60.0
WORST_FIRST = ("crashed", "stalled", "running", "terminated", "closed")


@dataclass(frozen=True)
class Health:
    """The thresholds, in beats of the rank (`beat_of`), but `no_step_s`: the longest a
    rank may report without stepping, in seconds (`--stall-after`,
    `ELASTIC_LOADER_DASHBOARD_STALL_AFTER_S`)."""

    stalled_after: float = 10
    crashed_after: float = 20
    no_step_s: float = 120.0
    rebuild_grace: float = 3
    step_factor: float = 10
    no_step_floor: float = 10
    killed_after: float = 2


DEFAULT_HEALTH = Health()


def beat_of(rank: dict[str, Any]) -> float:
    """The rank's heartbeat: the smaller of its last two intervals, never below the client's
    own period (0.1-60 s)."""
    floor = rank.get("heartbeat_s") or DEFAULT_INTERVAL_S
    last = rank.get("interval_s") or floor
    before = rank.get("prev_interval_s") or last
    return min(MAX_BEAT_S, max(MIN_BEAT_S, floor, min(last, before)))


interval_of = beat_of  # its name before the beat had a floor


def position(rank: dict[str, Any]) -> int | None:
    """The rank's step: the global one (clients older than it send the epoch's only)."""
    return rank["global_step"] if rank.get("global_step") is not None else rank.get("step")


def completed_epochs(rank: dict[str, Any]) -> int:
    """Epochs the rank finished: the `epoch_end`s it sent, or else the epoch it stands in."""
    return max(rank.get("epochs_done") or 0, rank.get("epoch") or 0)


def on_our_clock(rank: dict[str, Any], ts: float) -> float:
    """The rank's time `ts` on the collector's clock (its measured offset added)."""
    return ts + (rank.get("clock_offset") or 0.0)


def received(rank: dict[str, Any]) -> float:
    """When the collector received the process's last report (its own clock)."""
    recv = rank.get("recv_ts")
    return float(recv) if recv is not None else on_our_clock(rank, rank["ts"])


def step_received(rank: dict[str, Any]) -> float:
    """When the collector received the report in which the process's step last moved."""
    recv = rank.get("step_recv")
    if recv is not None:
        return float(recv)
    return on_our_clock(rank, rank.get("step_ts") or rank["ts"])


def closed_at(rank: dict[str, Any], closed: Closed) -> float:
    """When the collector received the process's `closed`."""
    return closed.recv if closed.recv is not None else on_our_clock(rank, closed.ts)


def _at_epoch_end(rank: dict[str, Any]) -> bool:
    return rank.get("end_step") is not None and rank["end_step"] == position(rank)


def no_step_limit(
    rank: dict[str, Any], health: Health = DEFAULT_HEALTH, beat: float | None = None
) -> float:
    """How long the rank may report without stepping (see the module docstring); `beat`:
    the rank's `beat_of`, when the caller has it."""
    moved = rank.get("moved_s")
    if moved is None or _at_epoch_end(rank):
        return health.no_step_s
    beat = beat_of(rank) if beat is None else beat
    return min(health.no_step_s, max(health.no_step_floor * beat, health.step_factor * moved))


def rank_state(
    rank: dict[str, Any], closed: Closed | None, now: float, health: Health = DEFAULT_HEALTH
) -> tuple[str, str | None]:
    """The rank's state and why: `silent`, `no step`, `error`, `signal` (or None)."""
    beat = beat_of(rank)
    if closed is not None and closed_at(rank, closed) >= received(rank):
        if closed.reason == CLOSE_REASON_ERROR:
            return "crashed", "error"
        if closed.reason == CLOSE_REASON_TERMINATED:
            return "terminated", "signal"
        rebuilding = closed.reason == CLOSE_REASON_CLOSE
        if rebuilding and now - closed_at(rank, closed) < health.rebuild_grace * beat:
            return "running", None
        return "closed", None
    silent = now - received(rank)
    if silent > health.crashed_after * beat:
        return "crashed", "silent"
    if silent > health.stalled_after * beat:
        return "stalled", "silent"
    no_step = now - step_received(rank)
    if no_step > no_step_limit(rank, health, beat):
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


def _lost_close(run: dict[str, Any], rank: dict[str, Any], closed_epochs: list[int]) -> bool:
    """A silent rank that stopped where the job ended: its `closed` was lost, not its life."""
    if not _at_epoch_end(rank):
        return False
    if run.get("total_epochs") or run.get("total_steps"):
        return _reached(run, rank)
    return bool(closed_epochs) and completed_epochs(rank) >= max(closed_epochs)


def _killed(
    judged: list[tuple[dict[str, Any], str, str | None]],
    closed: dict[int, Closed],
    now: float,
    health: Health,
) -> list[tuple[dict[str, Any], str, str | None]]:
    """Once a process was terminated, one that went silent before that without a `closed`
    was killed (the launcher terminated the others because it died): crashed at once."""
    ends = [closed_at(r, closed[r["process"]]) for r, s, _ in judged if s == "terminated"]
    if not ends:
        return judged
    first = min(ends)
    out = []
    for r, state, why in judged:
        last = received(r)
        before = state in ("running", "stalled") and last < first
        if before and now - last > health.killed_after * beat_of(r):
            state, why = "crashed", "silent"
        out.append((r, state, why))
    return out


def _died_at(r: dict[str, Any], why: str | None, closed: dict[int, Closed]) -> float:
    """When a crashed rank died, by receipt: its `closed` for an error, else its last report."""
    return closed_at(r, closed[r["process"]]) if why == "error" else received(r)


def _first_death(
    judged: list[tuple[dict[str, Any], str, str | None]], closed: dict[int, Closed]
) -> tuple[dict[str, Any], str | None] | None:
    """The crashed process that died first, when that is a fact: others were terminated
    after it, or it died more than a beat before the next one (ranks that all went silent
    together name no cause)."""
    dead = sorted(
        (
            (_died_at(r, why, closed), r["process"], r, why)
            for r, s, why in judged
            if s == "crashed"
        ),
        key=lambda d: (d[0], d[1]),
    )
    if not dead:
        return None
    terminated = any(s == "terminated" for _, s, _ in judged)
    if terminated or len(dead) == 1 or dead[1][0] - dead[0][0] > beat_of(dead[0][2]):
        return dead[0][2], dead[0][3]
    return None


def run_status(
    store: Store,
    run: dict[str, Any],
    processes: list[dict[str, Any]] | None = None,
    health: Health = DEFAULT_HEALTH,
    now: float | None = None,
) -> dict[str, Any]:
    """The run's state, each process's state and silence (from `processes`, rows of
    `Store.heartbeats`, if the caller read them)."""
    ranks = processes
    now = time.time() if now is None else now
    if ranks is None:
        ranks = store.heartbeats(run["run_id"], run["world_size"])
    # a `closed` that counts came after the rank's last report
    since = min((received(r) for r in ranks), default=run.get("last_recv") or run["last_ts"])
    closed = store.closed_ranks(run["run_id"], run["world_size"], since)
    judged = [(r, *rank_state(r, closed.get(r["process"]), now, health)) for r in ranks]
    judged = _killed(judged, closed, now, health)
    closed_epochs = [completed_epochs(r) for r, state, _ in judged if state == "closed"]
    cause = _first_death(judged, closed)
    states = []
    counts = dict.fromkeys(WORST_FIRST, 0)
    for r, state, why in judged:
        if why == "silent" and _lost_close(run, r, closed_epochs):
            state, why = "closed", None
        if state == "terminated" and cause is not None:
            why = f"after {process_name(cause[0])} died"
        counts[state] += 1
        silent = now - received(r)
        no_step = now - step_received(r)
        error = closed[r["process"]].error if why == "error" else None
        states.append(
            {"rank": r["rank"], "process": r["process"], "mesh": r.get("mesh"),
             "state": state, "silent_s": max(0.0, silent),
             "last_ts": r["ts"], "global_step": position(r), "why": why, "error": error,
             "no_step_s": max(0.0, no_step), "first": cause is not None and r is cause[0]}
        )  # fmt: skip
    missing = max(0, run["world_size"] - len({r["rank"] for r in ranks}))
    restart = any(c.restart for c in closed.values()) and counts["terminated"] > 0
    state = _run_state(run, ranks, states, counts, missing, restart)
    stopped_at = _stopped_mid_epoch(store, run, ranks) if state == "finished" else None
    state = "stopped" if stopped_at else state
    text = headline(state, states, counts, run["world_size"])
    return {
        "state": state,
        "resumed": run.get("prev_world_size") is not None or run.get("resumed_ts") is not None,
        "now": now,
        "last_ts": max((r["ts"] for r in ranks), default=run["last_ts"]),
        "counts": counts,
        "missing": missing,
        "ranks": states,
        "headline": (
            f"Stopped at {stopped_at}: {'the rank' if len(states) == 1 else 'every rank'} "
            "closed before the epoch's end"
            if stopped_at
            else text
        ),
        "stopped_at": stopped_at,
    }


def _run_state(
    run: dict[str, Any],
    ranks: list[dict[str, Any]],
    states: list[dict[str, Any]],
    counts: dict[str, int],
    missing: int,
    restart: bool,
) -> str:
    if not states:
        return "starting"
    if restart and not counts["running"] and not counts["stalled"]:
        return "restarted"  # a torchrun agent stopped its workers to start them again
    ended = counts["closed"] + counts["terminated"]
    if ended == len(states):
        done = not missing and not counts["terminated"] and all(_reached(run, r) for r in ranks)
        return "finished" if done else "stopped"
    return next(s for s in WORST_FIRST if counts[s])


def _stopped_mid_epoch(
    store: Store, run: dict[str, Any], ranks: list[dict[str, Any]]
) -> str | None:
    """Without a stated length, a run whose processes all closed finished only at an epoch's
    end (an `epoch_end` at their last step, or the epoch read to its end); else where it
    stopped: '
    33.8 % of epoch 2' (counted from 1, as the pages do), or None."""
    if run.get("total_epochs") or run.get("total_steps") or all(_at_epoch_end(r) for r in ranks):
        return None
    epoch, share = store.epoch_read(run["run_id"], run["world_size"], run["num_splits"])
    if share >= 1.0 or (share == 0.0 and epoch > 0):
        return None  # read to the end, or closed as the next epoch began
    return f"{100 * share:.1f} % of epoch {epoch + 1}"


def public(status: dict[str, Any], most: int = 64) -> dict[str, Any]:
    """What every page's status line fetches each second: the crashed, stalled and
    terminated ranks (the first to die first, worst first, at most `most`), not all 1,024."""
    order = {s: i for i, s in enumerate(WORST_FIRST)}
    shown = [r for r in status["ranks"] if r["state"] in ("crashed", "stalled", "terminated")]
    shown.sort(key=lambda r: (not r["first"], order[r["state"]], -r["silent_s"], r["process"]))
    return {**status, "ranks": shown[:most]}


def by_rank(status: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Data-parallel rank → the worst state of its processes (its replicas on a mesh), for
    the pages that place data: a rank is as alive as its least alive replica."""
    order = {s: i for i, s in enumerate(WORST_FIRST)}
    out: dict[int, dict[str, Any]] = {}
    for r in status["ranks"]:
        known = out.get(r["rank"])
        if known is None or order[r["state"]] < order[known["state"]]:
            out[r["rank"]] = r
    return out
