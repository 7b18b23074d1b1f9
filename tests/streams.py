"""Generated telemetry streams for the status rules' property tests (tests/test_status_rules.py).

A stream is what the collector would receive from a job's processes: heartbeats about every
`beat` seconds with jitter (a loaded machine delays them), early sends (an event wakes the
sender: a short interval that is not a heartbeat), slow and uneven steps, a clock skew per
process, heartbeats lost on the way, and replicas (several processes of one data-parallel
rank). Times are true times; each event's `ts` and `sent_ts` are on its process's clock.
`troubled` adds what real clocks and networks do (issue 33): a clock stepped back, one
heartbeat from the future, a `sent_ts` of 0, and batches delivered twice (replays).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from loader import wire

S = 8  # splits: W in {1, 2, 4} divides it
REPLICAS = [1, 1, 2]  # processes per data-parallel rank (2: tensor-parallel peers)
T0 = 1.7e9  # true time 0 of every stream (an epoch second)


@dataclass
class Process:
    """One process of the stream: its data-parallel rank, its global rank, its clock skew,
    and its sends as (true time, event)."""

    rank: int
    global_rank: int
    skew: float
    sends: list[tuple[float, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Stream:
    beat: float
    world: int
    replicas: int
    processes: list[Process]

    def events(self) -> list[tuple[float, dict[str, Any]]]:
        """Every send of every process, in true-time order."""
        return sorted((s for p in self.processes for s in p.sends), key=lambda s: s[0])

    def live_until(self) -> float:
        """The last true time at which every process has sent its last heartbeat."""
        return min(p.sends[-1][0] for p in self.processes)


def _event(p: Process, stream: Stream, kind: str, t: float, **fields: Any) -> dict[str, Any]:
    ev = {"run_id": "prop", "kind": kind, "ts": T0 + t + p.skew, "rank": p.rank}
    ev |= {"incarnation": f"{p.global_rank + 1:08x}", "seq": len(p.sends)}  # numbered as sent
    ev |= {"world_size": stream.world, "num_splits": S, "rows_per_split": 1000}
    ev |= {"heartbeat_s": stream.beat}
    if stream.replicas > 1:
        ev |= {
            "global_rank": p.global_rank,
            "mesh": {"dp": p.rank, "tp": p.global_rank % stream.replicas},
        }
    return ev | fields


@st.composite
def healthy_streams(
    draw: st.DrawFn,
    seconds: float = 60.0,
    max_step_s: float = 3.0,
    beats: tuple[float, ...] = (0.5, 1.0, 2.0),
    max_lose: float = 0.3,
) -> Stream:
    """A healthy job: every process reports and steps, at its own uneven pace."""
    beat = draw(st.sampled_from(beats))
    world = draw(st.sampled_from([1, 2, 4]))
    replicas = draw(st.sampled_from(REPLICAS))
    step_s = draw(st.floats(0.02, max_step_s))  # the usual step time
    slow = draw(st.floats(1.0, 3.0))  # the slowest step, in usual step times
    late = draw(st.floats(0.0, 1.5))  # the latest heartbeat, in beats past due
    lose = draw(st.floats(0.0, max_lose))  # the share of heartbeats lost on the way
    procs = [Process(g // replicas, g, draw(st.floats(-5.0, 5.0))) for g in range(world * replicas)]
    stream = Stream(beat, world, replicas, procs)
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))  # the pace: small to draw
    # the steps of each data-parallel rank (its replicas step together): their end times
    ends: dict[int, list[float]] = {}
    for rank in range(world):
        t, out = 0.0, []
        while t < seconds + 10:
            t += step_s * rng.uniform(0.5, slow)
            out.append(t)
        ends[rank] = out
    for p in procs:
        t, last, lost_run, step = rng.uniform(0, beat), 0.0, 0, 0
        while t < seconds:
            while step < len(ends[p.rank]) and ends[p.rank][step] <= t:
                step += 1
            fields = {"epoch": 0, "step": step, "global_step": step, "interval_s": t - last}
            fields |= {"rows": 1, "batches": 1, "sent_ts": T0 + t + p.skew}
            lost = lost_run < 2 and rng.random() < lose
            lost_run = lost_run + 1 if lost else 0
            if not lost:
                p.sends.append((t, _event(p, stream, wire.PROGRESS, t, **fields)))
            last = t
            woke = rng.random() < 0.1  # an event sent at once: a short interval
            t += rng.uniform(0.05, 0.3) if woke else beat * (1 + rng.uniform(-0.2, late))
    return stream


def killed(stream: Stream, victim: int, at: float, terminate_after: float | None) -> None:
    """Process `victim` sends nothing from true time `at` on (SIGKILL); with
    `terminate_after`, the others are terminated that long after and say so."""
    for p in stream.processes:
        if p.global_rank == victim:
            p.sends = [s for s in p.sends if s[0] < at]
        elif terminate_after is not None:
            end = at + terminate_after
            p.sends = [s for s in p.sends if s[0] < end]
            data = {"reason": wire.CLOSE_REASON_TERMINATED, "signal": "SIGTERM"}
            p.sends.append((end, _event(p, stream, wire.CLOSED, end, data=data)))


def hung(stream: Stream, at: float) -> None:
    """From true time `at` no step of any process moves (a hung collective); heartbeats go on."""
    for p in stream.processes:
        frozen = None
        for t, ev in p.sends:
            if t >= at and ev["kind"] == wire.PROGRESS:
                frozen = ev["global_step"] if frozen is None else frozen
                ev["step"] = ev["global_step"] = frozen


TROUBLES = ("none", "stepped back", "future", "zero sent_ts")


@st.composite
def troubles(draw: st.DrawFn, processes: int) -> list[tuple[str, float, float]]:
    """Per process: what its clock does (`TROUBLES`), from which true time, and the share
    of its sends delivered a second time later."""
    return [
        (draw(st.sampled_from(TROUBLES)), draw(st.floats(2.0, 40.0)), draw(st.floats(0.0, 0.3)))
        for _ in range(processes)
    ]


def troubled(stream: Stream, plan: list[tuple[str, float, float]], seed: int) -> None:
    """Apply `plan` (`troubles`) to the sends as they leave: a clock stepped back an hour
    from `at` on; one heartbeat at `at` 4 min ahead; heartbeats from `at` on with `sent_ts`
    0; and a `replay` share of sends re-delivered byte for byte 0.5-20 s after (a retry or
    a proxy's resend), the dead's included."""
    rng = random.Random(seed)
    for p, (trouble, at, replay) in zip(stream.processes, plan, strict=True):
        future_done = False
        for t, ev in p.sends:
            if t < at:
                continue
            if trouble == "stepped back":
                ev["ts"] -= 3600.0
                if "sent_ts" in ev:
                    ev["sent_ts"] -= 3600.0
            elif trouble == "future" and not future_done and "sent_ts" in ev:
                ev["ts"] += 240.0
                ev["sent_ts"] += 240.0
                future_done = True
            elif trouble == "zero sent_ts" and "sent_ts" in ev:
                ev["sent_ts"] = 0.0
        again = [
            (t + rng.uniform(0.5, 20.0), dict(ev)) for t, ev in p.sends if rng.random() < replay
        ]
        p.sends = sorted([*p.sends, *again], key=lambda s: s[0])
