"""A mixture's weight phases, as its `mixture` and live `mixture_progress` events report them.

Each event names the weights in force and the global step they took effect (`phase_start`);
the Timeline draws a phase at that step, not where an event first mentioned it (the next
epoch's start, for a schedule's change mid-epoch). When that step ran is read between the
two reports around it (global step against time), since no event is sent at the step itself.
"""

from __future__ import annotations

import bisect
from typing import Any

from dashboard.collector.store import Store
from loader import wire

MOST_EVENTS = 10_000  # reports read per kind: a live one every few heartbeats


def phases(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Per phase, in step order: `step` (where it took effect), `ts` (when, estimated),
    `names`, `weights` (texts, as the loader sent them), `ranks` that reported it and the
    `data` of its first report."""
    reports = [
        e
        for kind in (wire.MIXTURE, wire.MIXTURE_PROGRESS)
        for e in store.events(run_id, kind, MOST_EVENTS)
        if isinstance(e["data"], dict) and e["data"].get("names")
    ]
    reports.sort(key=lambda e: (e["global_step"] or 0, e["ts"]))
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in reports:
        data = e["data"]
        start = data.get("phase_start")
        start = start if isinstance(start, int) else e["global_step"] or 0
        key = (start, tuple(wire.text_list(data, "weights")))
        phase = found.setdefault(key, {"step": start, "data": data, "ranks": set()})
        phase["ranks"].add(e["rank"])
    clock = [(e["global_step"] or 0, e["ts"]) for e in reports]
    out = []
    for phase in sorted(found.values(), key=lambda p: p["step"]):
        data = phase["data"]
        out.append(
            {"step": phase["step"], "ts": when(clock, phase["step"]), "data": data,
             "names": wire.text_list(data, "names"), "weights": wire.text_list(data, "weights"),
             "ranks": len(phase["ranks"])}
        )  # fmt: skip
    return out


def when(clock: list[tuple[int, float]], step: int) -> float:
    """The time global `step` ran, read linearly between the reports before and after it
    (`clock`: (global step, ts), sorted by step); the nearest report's time outside them."""
    i = bisect.bisect_left([s for s, _ in clock], step)
    if i == len(clock):
        return clock[-1][1]
    if i == 0 or clock[i][0] == step:  # the first report at that step (sorted by step, ts)
        return clock[i][1]
    (s0, t0), (s1, t1) = clock[i - 1], clock[i]
    return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
