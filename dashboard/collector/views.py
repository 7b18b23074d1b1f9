"""Turn stored rows into what the dashboard draws; each function answers one endpoint.

Kept apart from `store.py` (SQL only) and the routes (HTTP only) so the shaping — who owns
which split, epoch %, ETA, resume labels — is plain Python that tests can call (the
throughput view, with its cache, is `throughput.py`; the timeline of a run's events,
resumes and crashes is `timeline.py`).
"""

from __future__ import annotations

from typing import Any

from dashboard.collector.status import (
    DEFAULT_HEALTH,
    Health,
    by_rank,
    completed_epochs,
    public,
    replicas_text,
    run_status,
)
from dashboard.collector.store import Store
from dashboard.placement import layout_of, mixture_layout
from loader.layout import fit_reason, rank_pieces, supported_world_sizes, uses_steps


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
    states = by_rank(status)
    gpu = gpu_labels(ranks)
    for r in ranks:
        known = states.get(r["rank"])
        r["replicas"] = replicas_text(r["rank"], status["ranks"])
        r["gpu"] = gpu[r["rank"]]
        r["state"] = known["state"] if known else "previous world"
        r["silent_s"] = known["silent_s"] if known else None
    grid = layout_of(world_size, run["num_splits"], global_batch(ranks))
    return {"world_size": world_size, **grid, "ranks": ranks}


def global_batch(ranks: list[dict[str, Any]]) -> int | None:
    """The world's global batch G, as its ranks reported it (None from older clients)."""
    return max((r["global_batch_size"] for r in ranks if r.get("global_batch_size")), default=None)


def placement(store: Store, run: dict[str, Any], health: Health = DEFAULT_HEALTH) -> dict[str, Any]:
    """Current split → rank layout and, after a resume on another W, the one before."""
    prev = run["prev_world_size"]
    ranks = store.ranks(run["run_id"], run["world_size"])
    status = run_status(store, run, health=health)
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
        "mixture": _mixture(store, run),
    }


def _mixture(store: Store, run: dict[str, Any]) -> dict[str, Any] | None:
    """A mixture run's datasets and the layout of the step its latest `mixture` event
    describes (in the current world size); None for a run of one dataset."""
    last = store.latest_mixture(run["run_id"])
    if last is None:
        return None
    placed = mixture_layout(last["data"], run["world_size"])
    return {"global_step": last["global_step"], **placed}


def _ended_epoch(r: dict[str, Any], state: str) -> bool:
    """A closed rank standing at the start of an epoch (the position after its last batch):
    what it did is the epoch before, read to the end, not 0 % of one it never began."""
    lo, hi = (r["splits"] or [0, 0])[:2]
    own = r["cursors"] or []
    fresh = len(own) == hi - lo and not any(own)
    return state == "closed" and fresh and (r["epoch"] or 0) > 0


def _rank_progress(
    r: dict[str, Any], num_splits: int, per_split: int, state: str
) -> dict[str, Any]:
    """One rank's bar; `per_split` is L rows, or for packed data the rank's epoch's blocks.
    Of a split it shares with others the rank counts its part (`_part_of`), so the bars
    add up to the cursors' total."""
    per_split = r.get("blocks_per_split") or per_split
    lo, hi = (r["splits"] or [0, 0])[:2]
    own = r["cursors"] or []
    parts = _parts(r, num_splits, hi - lo)
    done = (
        sum(_part_of(c, p) for c, p in zip(own, parts, strict=False)) if len(own) == hi - lo else 0
    )
    total = sum(_part_of(per_split, p) for p in parts)
    if _ended_epoch(r, state):
        r["epoch"], done, r["cursors"] = r["epoch"] - 1, total, [per_split] * (hi - lo)
    out = {"rank": r["rank"], "epoch": r["epoch"], "step": r["step"]}
    out.update(global_step=r.get("global_step"), state=state, rows_per_s=r["rows_per_s"])
    out.update(rows_done=done, rows_total=total, pct=100.0 * done / total if total else 0.0)
    out["tokens"] = r.get("tokens")
    return out


def _parts(r: dict[str, Any], num_splits: int, count: int) -> list[tuple[int, int, int]]:
    """The rank's part of each of its `count` splits: positions [start, stop) of the split's
    `of` rows in every global step (whole where its layout is unknown)."""
    world, batch = r["world_size"], r.get("global_batch_size")
    if fit_reason(num_splits, world, batch):
        return [(0, 1, 1)] * count
    of = batch // num_splits if batch and uses_steps(num_splits, batch) else 1
    pieces = rank_pieces(r["rank"], world, num_splits, batch)
    return [(p.start, p.stop, of) for p in pieces for _ in p.splits]


def _part_of(cursor: int, part: tuple[int, int, int]) -> int:
    """The rows of a split's first `cursor` that lie in the rank's part of every step: the
    parts of one split add up to its cursor at every cursor, a short last step included
    (`cursor * rows // of` lost a row of a shared split there: 7,350 of 7,352)."""
    start, stop, of = part
    return cursor // of * (stop - start) + min(max(cursor % of - start, 0), stop - start)


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


def progress(store: Store, run: dict[str, Any], health: Health = DEFAULT_HEALTH) -> dict[str, Any]:
    """Per-split cursors, per-rank bars and the headline, all from one read of the ranks.

    The headline is the bars' total (rows read ÷ rows owned by the ranks that reported),
    so the two cannot disagree; rows/s counts only ranks that are still running. For packed
    data (`unit` "blocks") the cursors, rows and rows/s count blocks of `seq_len` tokens, and
    the `tokens_*` fields say the same in tokens (None for row data). A closed rank at the
    start of an epoch shows the epoch it completed, read to the end; `epochs_done` counts
    the epochs every rank completed.
    """
    ranks = store.ranks(run["run_id"], run["world_size"])
    num_splits, (unit, per_split) = run["num_splits"], _units(run, ranks)
    status = run_status(store, run, health=health)
    state_of = {rank: s["state"] for rank, s in by_rank(status).items()}
    mixed = store.latest_mixture(run["run_id"])
    if mixed is not None:
        return _mixture_progress(store, run, ranks, status, mixed)
    epochs_done = min((completed_epochs(r) for r in ranks), default=None)
    cursors: list[int | None] = [None] * num_splits
    bars = []
    for r in ranks:
        bars.append(_rank_progress(r, num_splits, per_split, state_of.get(r["rank"], "closed")))
        bars[-1]["replicas"] = replicas_text(r["rank"], status["ranks"])
        lo, hi = (r["splits"] or [0, 0])[:2]
        if r["cursors"] is not None and len(r["cursors"]) == hi - lo:
            # Ranks sharing a split report the same global cursor: the latest is the largest.
            cursors[lo:hi] = [
                max(c, o or 0) for c, o in zip(r["cursors"], cursors[lo:hi], strict=True)
            ]
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
        "epochs_done": epochs_done,
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
        "job": job_progress(run, bars, rate, finished, rows_total, global_batch(ranks)),
        "ranks": bars,
        "skipped": _balance_skipped(ranks),
        **_tokens(run, bars, rows_total, rate),
    }


def _balance_skipped(ranks: list[dict[str, Any]]) -> int:
    """Units of the latest epoch no rank reads on this W (every rank there reports the same)."""
    latest = max((r["epoch"] for r in ranks if r["epoch"] is not None), default=None)
    return max((r["skipped"] or 0 for r in ranks if r["epoch"] == latest), default=0)


def _mixture_progress(
    store: Store,
    run: dict[str, Any],
    ranks: list[dict[str, Any]],
    status: dict[str, Any],
    mixed: dict[str, Any],
) -> dict[str, Any]:
    """A mixture's progress: what its ranks handed out (a mixture has no splits of its own:
    its datasets' cursors are in its `mixture` events). The run's rows (packed: blocks) and
    tokens are what its datasets supplied since the run began (the latest `mixture` event,
    the same count on every W); each rank's, what it reported handing out in this world.
    The total is the job's stated steps × G, else what was handed out."""
    facts, g = mixed["data"], global_batch(ranks) or 0
    packed = run.get("seq_len") is not None
    state_of = {rank: s["state"] for rank, s in by_rank(status).items()}
    handed = {
        int(t["rank"]): t
        for t in store.rank_totals(run["run_id"], run["world_since"], run["world_size"])
    }
    steps = run.get("total_steps")
    bars = []
    for r in ranks:
        mine = handed.get(r["rank"])
        done = int(mine["rows"] or 0) if mine else 0
        total = max(done, steps * (r.get("batch_size") or 0)) if steps else done
        bar = {"rank": r["rank"], "epoch": r["epoch"], "step": r["step"]}
        bar.update(global_step=r.get("global_step"), state=state_of.get(r["rank"], "closed"))
        bar.update(rows_per_s=r["rows_per_s"], rows_done=done, rows_total=total)
        bar.update(pct=100.0 * done / total if total else 0.0, tokens=None)
        if packed and mine:
            bar["tokens"] = int(mine["tokens"] or 0)
        bar["replicas"] = replicas_text(r["rank"], status["ranks"])
        bars.append(bar)
    rows_done = sum(int(v) for v in facts.get("supplied") or [])
    rows_total = max(rows_done, steps * g) if steps else rows_done
    rate = sum(b["rows_per_s"] for b in bars if b["state"] == "running")
    finished = status["state"] == "finished"
    eta = 0.0 if finished else (rows_total - rows_done) / rate if rate > 0 else None
    seq_len = run.get("seq_len")
    return {
        "run_id": run["run_id"], "state": status["state"],
        "epoch": max((b["epoch"] for b in bars if b["epoch"] is not None), default=None),
        "epochs_done": min((completed_epochs(r) for r in ranks), default=None),
        "unit": "blocks" if packed else "rows", "rows_per_split": run["rows_per_split"],
        "cursors": [None] * run["num_splits"],  # its datasets' are in its `mixture` events
        "owner": layout_of(run["world_size"], run["num_splits"], g or None)["owner"],
        "rows_done": rows_done, "rows_total": rows_total,
        "epoch_pct": 100.0 * rows_done / rows_total if rows_total else 0.0,
        "rows_per_s": rate, "eta_s": eta,
        "global_step": max((b["global_step"] or 0 for b in bars), default=None),
        "job": job_progress(run, bars, rate, finished, rows_total, g or None),
        "ranks": bars, "seq_len": seq_len,
        "tokens_done": sum(int(t) for t in facts.get("tokens_supplied") or []) if packed else None,
        "tokens_total": rows_total * seq_len if seq_len else None,
        "tokens_per_s": rate * seq_len if seq_len else None,
    }  # fmt: skip


def job_progress(
    run: dict[str, Any],
    bars: list[dict[str, Any]],
    rate: float,
    finished: bool,
    epoch_rows: int | None = None,
    step_rows: int | None = None,
) -> dict[str, Any]:
    """'epoch x of N' / 'step x of N', share of the job done and its ETA, when it told us N.
    `epoch_rows`: what an epoch holds in the unit of `rate` (default S × L rows);
    `step_rows`: G, the rows of a step (default the reported batch_size × W, which is off
    where per-rank batches differ by one)."""
    total_epochs, total_steps = run.get("total_epochs"), run.get("total_steps")
    out: dict[str, Any] = {"total_epochs": total_epochs, "total_steps": total_steps}
    out.update(pct=None, eta_s=None, label=None)
    if not bars or not (total_epochs or total_steps):
        return out
    if total_steps:
        step = min(b["global_step"] or 0 for b in bars)
        per_step = step_rows or (run.get("batch_size") or 0) * run["world_size"]
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
