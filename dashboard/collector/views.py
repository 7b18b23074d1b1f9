"""Turn stored rows into what the dashboard draws; each function answers one endpoint.

Kept apart from `store.py` (SQL only) and the routes (HTTP only) so the shaping — who owns
which split, epoch %, ETA, stragglers, resume labels — is plain Python that tests can call.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

import numpy as np

from dashboard.collector.status import public, ranks_text, run_status
from dashboard.collector.store import ROLLUP_S, Store
from dashboard.placement import RankRate, layout_of, rank_shares, stragglers
from loader import wire
from loader.layout import fit_reason, supported_world_sizes, uses_steps

MAX_POINTS = 2000
STRAGGLER_WINDOW_S = 30.0
SAMPLE_BUDGET = 40_000  # per-second sample rows one throughput query may group
SETTLED_S = 30.0  # buckets this much older than the last report are final (and cached)
_SETTLED: dict[tuple[Any, ...], dict[str, Any]] = {}
SLOWEST = 5
INPUT_BOUND = 0.10  # a loop that waits for data this share of its step time is input-bound


def gpu_labels(ranks: list[dict[str, Any]]) -> dict[int, int]:
    """Rank → GPU index on its host: the reported local rank where the host's are distinct,
    else the rank's place among its host's ranks (launchers that leave `LOCAL_RANK` unset
    report 0 for all; torchrun and ours number a host's ranks consecutively)."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append(r)
    gpu = {}
    for host_ranks in by_host.values():
        reported = [r["local_rank"] for r in host_ranks]
        distinct = len(set(reported)) == len(reported)
        for i, r in enumerate(sorted(host_ranks, key=lambda r: r["rank"])):
            gpu[r["rank"]] = r["local_rank"] if distinct else i
    return gpu


def _layout(
    run: dict[str, Any], world_size: int, ranks: list[dict[str, Any]], status: dict[str, Any]
) -> dict[str, Any]:
    states = {s["rank"]: s for s in status["ranks"]}
    gpu = gpu_labels(ranks)
    for r in ranks:
        known = states.get(r["rank"])
        r["gpu"] = gpu[r["rank"]]
        r["state"] = known["state"] if known else "previous world"
        r["silent_s"] = known["silent_s"] if known else None
    grid = layout_of(world_size, run["num_splits"], global_batch(ranks))
    return {"world_size": world_size, **grid, "ranks": ranks}


def global_batch(ranks: list[dict[str, Any]]) -> int | None:
    """The world's global batch G, as its ranks reported it (None from older clients)."""
    return max((r["global_batch_size"] for r in ranks if r.get("global_batch_size")), default=None)


def placement(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Current split → rank layout and, after a resume on another W, the one before."""
    prev = run["prev_world_size"]
    ranks = store.ranks(run["run_id"], run["world_size"])
    status = run_status(store, run, ranks)
    num_splits, batch = run["num_splits"], global_batch(ranks)
    return {
        "run_id": run["run_id"],
        "num_splits": num_splits,
        "rows_per_split": run["rows_per_split"],
        "supported_world_sizes": supported_world_sizes(num_splits),
        "any_world_size_up_to": batch if uses_steps(num_splits, batch) else None,
        "status": public(status),
        "current": _layout(run, run["world_size"], ranks, status),
        "previous": (
            _layout(run, prev, store.ranks(run["run_id"], prev), status) if prev else None
        ),
    }


def _rank_progress(
    r: dict[str, Any], num_splits: int, per_split: int, state: str
) -> dict[str, Any]:
    """One rank's bar; `per_split` is L rows, or for packed data the rank's epoch's blocks.
    Of a split it shares with others the rank counts its part (`rank_shares`), so the bars
    add up to the cursors' total."""
    per_split = r.get("blocks_per_split") or per_split
    lo, hi = (r["splits"] or [0, 0])[:2]
    own = r["cursors"] or []
    shares = _shares(r, num_splits, hi - lo)
    done = (
        sum(c * n // of for c, (n, of) in zip(own, shares, strict=False))
        if len(own) == hi - lo
        else 0
    )
    total = sum(per_split * n // of for n, of in shares)
    out = {"rank": r["rank"], "epoch": r["epoch"], "step": r["step"]}
    out.update(global_step=r.get("global_step"), state=state, rows_per_s=r["rows_per_s"])
    out.update(rows_done=done, rows_total=total, pct=100.0 * done / total if total else 0.0)
    out["tokens"] = r.get("tokens")
    return out


def _shares(r: dict[str, Any], num_splits: int, count: int) -> list[tuple[int, int]]:
    """The rank's part of each of its `count` splits (whole where its layout is unknown)."""
    world, batch = r["world_size"], r.get("global_batch_size")
    if fit_reason(num_splits, world, batch):
        return [(1, 1)] * count
    return rank_shares(r["rank"], world, num_splits, batch)


def _units(run: dict[str, Any], ranks: list[dict[str, Any]]) -> tuple[str, int]:
    """What the cursors count and up to how many per split: rows and L, or, for packed data
    (the run sent `seq_len`), blocks and the newest epoch's blocks per split."""
    if run.get("seq_len") is None:
        return "rows", run["rows_per_split"]
    newest = max(ranks, key=lambda r: (r["epoch"] or 0, r["ts"]), default=None)
    blocks = newest.get("blocks_per_split") if newest else None
    return "blocks", blocks if blocks is not None else run["rows_per_split"]


def _tokens(run: dict[str, Any], bars: list[dict[str, Any]], total: int, rate: float) -> Any:
    """Packed data: tokens handed out this epoch, of how many, and tokens/s; else Nones."""
    seq_len = run.get("seq_len")
    if seq_len is None:
        return {"seq_len": None, "tokens_done": None, "tokens_total": None, "tokens_per_s": None}
    done = sum(b["tokens"] or 0 for b in bars)
    return {
        "seq_len": seq_len,
        "tokens_done": done,
        "tokens_total": total * seq_len,
        "tokens_per_s": rate * seq_len,
    }


def progress(store: Store, run: dict[str, Any]) -> dict[str, Any]:
    """Per-split cursors, per-rank bars and the headline, all from one read of the ranks.

    The headline is the bars' total (rows read ÷ rows owned by the ranks that reported),
    so the two cannot disagree; rows/s counts only ranks that are still running. For packed
    data (`unit` "blocks") the cursors, rows and rows/s count blocks of `seq_len` tokens, and
    the `tokens_*` fields say the same in tokens (None for row data).
    """
    ranks = store.ranks(run["run_id"], run["world_size"])
    num_splits, (unit, per_split) = run["num_splits"], _units(run, ranks)
    status = run_status(store, run, ranks)
    state_of = {s["rank"]: s["state"] for s in status["ranks"]}
    cursors: list[int | None] = [None] * num_splits
    bars = []
    for r in ranks:
        lo, hi = (r["splits"] or [0, 0])[:2]
        if r["cursors"] is not None and len(r["cursors"]) == hi - lo:
            # Ranks sharing a split report the same global cursor: the latest is the largest.
            cursors[lo:hi] = [
                max(c, o or 0) for c, o in zip(r["cursors"], cursors[lo:hi], strict=True)
            ]
        bars.append(_rank_progress(r, num_splits, per_split, state_of[r["rank"]]))
    rows_done = sum(b["rows_done"] for b in bars)
    owned = sum(b["rows_total"] for b in bars)
    rate = sum(b["rows_per_s"] for b in bars if b["state"] == "running")
    rows_total = num_splits * per_split
    epochs = [b["epoch"] for b in bars if b["epoch"] is not None]
    finished = status["state"] == "finished"
    eta = 0.0 if finished else (rows_total - rows_done) / rate if rate > 0 else None
    return {
        "run_id": run["run_id"],
        "state": status["state"],
        "epoch": max(epochs) if epochs else None,
        "unit": unit,
        "rows_per_split": per_split,
        "cursors": cursors,
        "owner": layout_of(run["world_size"], num_splits, global_batch(ranks))["owner"],
        "rows_done": rows_done,
        "rows_total": rows_total,
        "epoch_pct": 100.0 * rows_done / owned if owned else 0.0,
        "rows_per_s": rate,
        "eta_s": eta,
        "global_step": max((b["global_step"] or 0 for b in bars), default=None),
        "job": job_progress(run, bars, rate, finished, rows_total),
        "ranks": bars,
        **_tokens(run, bars, rows_total, rate),
    }


def job_progress(
    run: dict[str, Any],
    bars: list[dict[str, Any]],
    rate: float,
    finished: bool,
    epoch_rows: int | None = None,
) -> dict[str, Any]:
    """'epoch x of N' / 'step x of N', share of the job done and its ETA, when it told us N.
    `epoch_rows`: what an epoch holds in the unit of `rate` (default S × L rows)."""
    total_epochs, total_steps = run.get("total_epochs"), run.get("total_steps")
    out: dict[str, Any] = {"total_epochs": total_epochs, "total_steps": total_steps}
    out.update(pct=None, eta_s=None, label=None)
    if not bars or not (total_epochs or total_steps):
        return out
    if total_steps:
        step = min(b["global_step"] or 0 for b in bars)
        per_step = (run.get("batch_size") or 0) * run["world_size"]
        done = min(1.0, step / total_steps)
        left_s = (total_steps - step) * per_step / rate if rate > 0 and per_step else None
        out["label"] = f"step {min(step, total_steps):,} of {total_steps:,}"
    else:
        epochs = [(b["epoch"] or 0) + b["pct"] / 100 for b in bars]
        done = min(1.0, sum(epochs) / len(epochs) / total_epochs)
        epoch_rows = epoch_rows or run["num_splits"] * run["rows_per_split"]
        left_s = (total_epochs * (1 - done)) * epoch_rows / rate if rate > 0 else None
        current = min(int(total_epochs or 0), max(int(b["epoch"] or 0) for b in bars) + 1)
        out["label"] = f"epoch {current} of {total_epochs}"
    out["pct"] = 100.0 if finished else 100.0 * done
    out["eta_s"] = 0.0 if finished else left_s
    return out


def _bucket_s(window_s: float, points: int) -> int:
    """Window ÷ points, in whole seconds and, from 10 s up, whole rollup buckets."""
    bucket = max(1, math.ceil(window_s / max(1, min(points, MAX_POINTS))))
    return 10 * math.ceil(bucket / 10) if bucket >= 10 else bucket


def throughput(store: Store, run: dict[str, Any], window_s: float, points: int) -> dict[str, Any]:
    """Rows/s across ranks as a band (median, min, max per time bucket) over the last
    `window_s`, the slowest ranks of the last 30 s, stragglers and the input-bound verdict.

    A band, not one line per rank: at 1,024 ranks lines are unreadable and 100,000 points
    to ship every second. A bucket in which no rank reported starts a new `segment`, so no
    line is drawn across an outage. Buckets grow to the 10 s rollup when the window's
    per-second samples would exceed `SAMPLE_BUDGET` rows, and buckets older than
    `SETTLED_S` are computed once and kept (`_settled`): each refresh reads only the last
    half minute, which keeps the query under 50 ms at 1,024 ranks.
    """
    since = run["last_ts"] - window_s
    bucket = _bucket_s(window_s, points)
    if bucket < ROLLUP_S and window_s * max(1, run["ranks"]) > SAMPLE_BUDGET:
        bucket = ROLLUP_S
    settled = _settled(store, run, since, bucket)
    fresh_from = max(since, max(settled, default=since - bucket) + bucket)
    band = {p["t"]: p for p in _band(store.series(run["run_id"], fresh_from, bucket))}
    points_in = sorted({**settled, **band}.items())
    totals = store.rank_totals(
        run["run_id"], run["last_ts"] - STRAGGLER_WINDOW_S, run["world_size"]
    )
    recent = _recent(totals)
    status = run_status(store, run)
    silent = [r["last_ts"] for r in status["ranks"] if r["state"] == "crashed"]
    return {
        "run_id": run["run_id"],
        "crashed_at": max(silent) if silent else None,
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


def _settled(store: Store, run: dict[str, Any], since: float, bucket: int) -> dict[float, Any]:
    """Band points of buckets that ended `SETTLED_S` before the run's last report: computed
    once per (database, run, bucket size), then served from memory (64 entries at most)."""
    key = (store.path, run["run_id"], run["first_ts"], bucket)
    entry = _SETTLED.pop(key, None)
    if entry is None or since < entry["from"]:
        entry = {"from": since, "to": since, "points": {}}
    _SETTLED[key] = entry  # most recently used last
    while len(_SETTLED) > 64:
        _SETTLED.pop(next(iter(_SETTLED)))
    horizon = run["last_ts"] - SETTLED_S
    if entry["to"] < horizon - bucket:
        rows = store.series(run["run_id"], entry["to"], bucket)
        done = [r for r in rows if r[1] + bucket <= horizon]
        entry["points"].update((p["t"], p) for p in _band(done))
        entry["to"] = max((p + bucket for p in entry["points"]), default=entry["to"])
    return {t: p for t, p in entry["points"].items() if t >= since - bucket}


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


def timeline(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Checkpoints, resumes, epoch ends (one item per kind, global step and W across ranks),
    outages (no rank reported for a rollup bucket or more) and a crash, in time order."""
    items = []
    for row in store.milestones(run["run_id"]):
        before = row["data"].get("world_size_before")
        before = before if isinstance(before, int) else None
        item = _item(row["kind"], row["ts"], row["step"], row["world_size"])
        item.update(epoch=row["epoch"], world_size_before=before, path=row["data"].get("path"))
        item.update(ranks=row["ranks"])
        item["label"] = _label(row["kind"], row["epoch"], row["step"], row["world_size"], before)
        items.append(item)
    found = items + _outages(store, run) + _crash(store, run)
    return sorted(found, key=lambda item: item["ts"])


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


def _crash(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    status = run_status(store, run)
    dead = [r for r in status["ranks"] if r["state"] == "crashed"]
    if not dead:
        return []
    last = max(dead, key=lambda r: r["last_ts"])
    item = _item("crash", last["last_ts"], last["global_step"], run["world_size"])
    who = (
        "every rank"
        if len(dead) == len(status["ranks"])
        else f"ranks {ranks_text([r['rank'] for r in dead])}"
    )
    at = f" after step {last['global_step']:,}" if last["global_step"] is not None else ""
    item.update(ranks=len(dead), label=f"crashed: {who} stopped reporting{at}")
    return [item]


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
