"""A run's timeline: checkpoints, resumes, epoch ends, mixture phases, outages, crashes and
terminations, each item labelled as a person reads it.

Kept apart from `views.py` (where the data is now: placement and progress) because this is
the run's history, and the crash rules (who stopped, before which resume) are its own
concern; the Throughput chart reuses them (`resume_crashes`).
"""

from __future__ import annotations

import itertools
from typing import Any

from dashboard.collector.phases import phases
from dashboard.collector.schema import ROLLUP_S
from dashboard.collector.status import DEFAULT_HEALTH, Health, ranks_text, run_status
from dashboard.collector.store import Store
from loader import wire


def timeline(
    store: Store, run: dict[str, Any], health: Health = DEFAULT_HEALTH
) -> list[dict[str, Any]]:
    """Checkpoints, resumes, epoch ends (one item per kind, global step and W across ranks),
    outages (no rank reported for a rollup bucket or more) and crashes — the current
    world's, and before each resume the one that made it necessary — in time order."""
    items = []
    for row in store.milestones(run["run_id"]):
        before = row["data"].get("world_size_before")
        before = before if isinstance(before, int) else None
        item = _item(row["kind"], row["ts"], row["step"], row["world_size"])
        item.update(epoch=row["epoch"], world_size_before=before, path=row["data"].get("path"))
        item.update(ranks=row["ranks"])
        item["label"] = _label(row["kind"], row["epoch"], row["step"], row["world_size"], before)
        if row["kind"] == wire.STEPS_SKIPPED:  # Megatron-style: the data of steps [a, b) unread
            item["label"] = f"skipped steps [{row['data'].get('start')}, {row['data'].get('stop')})"
        if row["kind"] != wire.MIXTURE:  # a mixture's weights: drawn as phases, below
            items.append(item)
    for phase in phases(store, run["run_id"]):  # where each set of weights took effect
        item = _item(wire.MIXTURE, phase["ts"], phase["step"], run["world_size"])
        item.update(ranks=phase["ranks"], label=_mixture_label(phase["data"], phase["step"]))
        items.append(item)
    resumes = [i for i in items if i["kind"] == wire.CHECKPOINT_LOADED]
    found = items + _outages(store, run) + _crash(store, run, health)
    found += _crashes_before(store, run, resumes) + _terminated(store, run)
    return sorted(found, key=lambda item: item["ts"])


def _terminated(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Processes stopped by a signal (a launcher's SIGTERM, a preemption): one item per
    world and signal, at the first one's `closed`, with the ranks and their last step."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for e in store.events(run["run_id"], wire.CLOSED, MOST_CLOSED):
        if e["data"].get("reason") == wire.CLOSE_REASON_TERMINATED:
            signal = e["data"].get("signal")
            key = (e["world_size"], signal if isinstance(signal, str) else "a signal")
            groups.setdefault(key, []).append(e)
    out = []
    for (world, signal), closed in groups.items():
        steps = [e["global_step"] for e in closed if e["global_step"] is not None]
        step = max(steps) if steps else None
        item = _item("terminated", min(e["ts"] for e in closed), step, world)
        ranks = sorted({e["rank"] for e in closed})
        who = f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"
        at = f" at step {step:,}" if step is not None else ""
        item.update(ranks=len(closed), label=f"terminated by {signal}: {who}{at}")
        out.append(item)
    return out


MOST_CLOSED = 100_000  # `closed` events read for the Timeline's terminated processes
REBUILT_WITHIN_S = 5.0  # a rebuilt loader's predecessor closes this soon after the resume


def resume_crashes(store: Store, run: dict[str, Any]) -> list[float]:
    """When each crash that a resume of the run followed happened (its stretch's last
    report that handed out data): the Throughput chart keeps their rules after a resume."""
    resumes = [
        {"ts": row["ts"], "world_size": row["world_size"], "step": row["step"],
         "world_size_before": b if isinstance(b := row["data"].get("world_size_before"), int) else None}
        for row in store.milestones(run["run_id"])
        if row["kind"] == wire.CHECKPOINT_LOADED
    ]  # fmt: skip
    return [c["ts"] for c in _crashes_before(store, run, resumes)]


def _crashes_before(
    store: Store, run: dict[str, Any], resumes: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Before each resume: did the ranks of the stretch before it all close? If not (or one
    closed on an error), a crash item at that stretch's last report that handed out data."""
    out = []
    starts = [run["first_ts"], *(r["ts"] for r in resumes)]
    closes = store.events(run["run_id"], wire.CLOSED, MOST_CLOSED) if resumes else []
    for since, resume in zip(starts, resumes, strict=False):
        last = store.last_active(run["run_id"], resume["ts"])
        if last is None or last["ts"] < since:
            continue  # nothing was read before this resume (or it is a second resume at once)
        world = resume["world_size_before"] or resume["world_size"]
        fine = {
            c["rank"] for c in closes
            if c["data"].get("reason") != wire.CLOSE_REASON_ERROR and _closed_before(c, last["ts"], resume)
        }  # fmt: skip
        lost = world - len(fine & set(range(world)))
        if lost <= 0:
            continue
        item = _item("crash", float(last["ts"]), None, world)
        item.update(ranks=lost, label=f"crashed before the resume: {lost:,} of {world:,} "
                    "ranks did not close")  # fmt: skip
        out.append(item)
    return out


def _closed_before(closed: dict[str, Any], last_ts: float, resume: dict[str, Any]) -> bool:
    """Did this `closed` end the stretch before `resume`? Sent in the 2 minutes before it,
    or (a loader rebuilt in its process, collected only after its successor loaded the
    state: an anneal) within `REBUILT_WITHIN_S` after it, at a step no later than it."""
    if last_ts - 120 <= closed["ts"] < resume["ts"]:
        return True
    step, at = closed["global_step"], resume["step"]
    late = resume["ts"] <= closed["ts"] < resume["ts"] + REBUILT_WITHIN_S
    return late and step is not None and at is not None and step <= at


def _item(kind: str, ts: float, step: int | None, world: int) -> dict[str, Any]:
    out = {"kind": kind, "ts": ts, "end_ts": None, "epoch": None, "step": step}
    out.update(world_size=world, world_size_before=None, path=None, ranks=0, label="")
    return out


def _outages(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    buckets = store.reporting_buckets(run["run_id"])
    out = []
    for a, b in itertools.pairwise(buckets):
        if b - a > 1:
            item = _item("outage", (a + 1) * ROLLUP_S, None, run["world_size"])
            item["end_ts"] = float(b * ROLLUP_S)
            item["label"] = f"no reports for {(b - a - 1) * ROLLUP_S:,} s or more"
            out.append(item)
    return out


def _crash(store: Store, run: dict[str, Any], health: Health) -> list[dict[str, Any]]:
    status = run_status(store, run, health=health)
    dead = [r for r in status["ranks"] if r["state"] == "crashed"]
    if not dead:
        return []
    last = max(dead, key=lambda r: r["last_ts"])
    ts, on = _crash_by(store, run, status, dead)
    item = _item("crash", max(ts, last["last_ts"]), last["global_step"], run["world_size"])
    who = (
        "every rank"
        if len(dead) == len(status["ranks"])
        else f"ranks {ranks_text([r['rank'] for r in dead])}"
    )
    at = f" after step {last['global_step']:,}" if last["global_step"] is not None else ""
    if on is not None and last["global_step"] is not None and on > last["global_step"]:
        at += f"; the others stepped on to step {on:,}"
    item.update(ranks=len(dead), label=f"crashed: {who} stopped reporting{at}")
    return [item]


def _crash_by(
    store: Store, run: dict[str, Any], status: dict[str, Any], dead: list[dict[str, Any]]
) -> tuple[float, int | None]:
    """By when a crash had happened, and the last step then: a dead process reported last
    before its next report was due, but its peers, which wait for it at every step, stepped
    on (a checkpoint saved meanwhile was saved before it died): the last step of the peers
    that stopped stepping (stalled, terminated, closed), at that step's time. (0, None)
    when no peer stopped: their steps date nothing."""
    stopped = {r["process"] for r in status["ranks"] if r["state"] not in ("running", "crashed")}
    stopped -= {r["process"] for r in dead}
    peers = [
        p for p in store.heartbeats(run["run_id"], run["world_size"]) if p["process"] in stopped
    ]
    if not peers:
        return 0.0, None
    latest = max(peers, key=lambda p: p.get("step_ts") or p["ts"])
    step = latest.get("global_step")
    return float(latest.get("step_ts") or latest["ts"]), step if isinstance(step, int) else None


def _mixture_label(data: dict[str, Any], step: int | None) -> str:
    """'mixture: web 7/10, code 1/5, math 1/10 at step 1,200'."""
    names, weights = wire.text_list(data, "names"), wire.text_list(data, "weights")
    shares = ", ".join(f"{n} {w}" for n, w in zip(names, weights, strict=False))
    at = f" at step {step:,}" if step is not None else ""
    return f"mixture: {shares}{at}"


def _label(kind: str, epoch: int | None, step: int | None, world: int, before: int | None) -> str:
    at = f" at step {step:,}" if step is not None else ""
    if kind == wire.CHECKPOINT_LOADED:
        moved = f"W {before} → {world}" if before is not None else f"W {world}"
        return f"resumed: {moved}{at}"
    if kind == wire.CHECKPOINT_SAVED:
        return f"checkpoint saved (W {world}){at}"
    if kind == wire.EPOCH_END:
        # counted from 1 on the pages, as in "epoch 3 of 3" (the loader's epoch 0 is epoch 1)
        return f"epoch {epoch + 1} ended{at}" if epoch is not None else f"epoch ended{at}"
    return f"{kind.replace('_', ' ')}{at}"
