"""The one sentence a person reads first about a run, from the states `status.py` judged:
e.g. "Crashed: rank 1 died first (stopped reporting without closing, silent for 3 s);
ranks 0, 2 terminated after rank 1 died". Rank lists stay one line at 1,024 ranks."""

from __future__ import annotations

from typing import Any


def ranks_text(ranks: list[int], most: int = 8) -> str:
    """'3, 17' or '0, 1, …, 7 and 1,016 more': rank lists that stay one line at 1,024 ranks."""
    shown = ", ".join(str(r) for r in ranks[:most])
    return shown + (f" and {len(ranks) - most:,} more" if len(ranks) > most else "")


def coordinates(mesh: dict[str, int] | None) -> str:
    """' (dp 1, tp 0)': a process's place on its mesh ('' without one)."""
    return f" ({', '.join(f'{k} {v}' for k, v in mesh.items())})" if mesh else ""


def process_name(r: dict[str, Any]) -> str:
    """'rank 3 (dp 1, tp 1)': a process by its global rank and mesh coordinates."""
    return f"rank {r.get('process', r['rank'])}{coordinates(r.get('mesh'))}"


def replicas_text(rank: int, processes: list[dict[str, Any]]) -> str | None:
    """'dp 0: ranks 0, 1 (tp)': a data-parallel rank and the processes that read its batches,
    with the mesh dims they differ on; None for a rank read by one process without a mesh."""
    mine = sorted((p for p in processes if p["rank"] == rank), key=lambda p: p["process"])
    if len(mine) < 2 and not any(p.get("mesh") for p in mine):
        return None
    meshes = [p.get("mesh") or {} for p in mine]
    dims = [d for d in (meshes[0] if meshes else {}) if len({m.get(d) for m in meshes}) > 1]
    by = f" ({', '.join(dims)})" if dims else ""
    word = "ranks" if len(mine) > 1 else "rank"
    return f"dp {rank}: {word} {ranks_text([p['process'] for p in mine])}{by}"


def _who(bad: list[dict[str, Any]], ranks: list[dict[str, Any]], most: int = 8) -> str:
    if len(bad) == len(ranks):
        return "every rank"
    if len(bad) == 1:
        return process_name(bad[0])
    named = [f"{r.get('process', r['rank'])}{coordinates(r.get('mesh'))}" for r in bad[:most]]
    more = f" and {len(bad) - most:,} more" if len(bad) > most else ""
    return f"ranks {', '.join(named)}{more}"


def _how(r: dict[str, Any]) -> str:
    """How one crashed rank died."""
    if r["why"] == "error":
        return f"ended on an uncaught {r['error'] or 'exception'}"
    return f"stopped reporting without closing, silent for {r['silent_s']:,.0f} s"


def _after(ranks: list[dict[str, Any]]) -> str:
    """'; ranks 0, 2 terminated after rank 1 died' (empty when none was terminated)."""
    ended = [r for r in ranks if r["state"] == "terminated"]
    first = next((r for r in ranks if r.get("first")), None)
    if not ended:
        return ""
    cause = f"after {process_name(first)} died" if first is not None else "by a signal"
    return f"; {_who(ended, ranks)} terminated {cause}"


def _trouble(state: str, ranks: list[dict[str, Any]]) -> str:
    """'Crashed: rank 0 ended on an uncaught ValueError', '…silent for 41 s', '…no step'."""
    bad = [r for r in ranks if r["state"] == state]
    first = next((r for r in bad if r.get("first")), None)
    if state == "crashed" and first is not None and (len(bad) > 1 or _after(ranks)):
        return f"Crashed: {process_name(first)} died first ({_how(first)}){_after(ranks)}"
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
    if state == "restarted":
        first = next((r for r in ranks if r.get("first")), None)
        why = f" after {process_name(first)} died" if first is not None else ""
        return f"Restarted: the elastic agent is restarting the workers{why}"
    if state == "finished":
        return f"Finished: {every} closed"
    if state == "stopped" and len(ranks) < world_size:
        seen = {r["rank"] for r in ranks}
        never = [r for r in range(world_size) if r not in seen]
        who = f"rank{'s' if len(never) > 1 else ''} {ranks_text(never)}"
        return f"Stopped: {every} that reported closed; {who} never reported"
    if state == "stopped" and counts.get("terminated"):
        ended = [r for r in ranks if r["state"] == "terminated"]
        return f"Stopped: {_who(ended, ranks)} terminated by a signal"
    if state == "stopped":
        return f"Stopped: {every} closed before the job's stated end"
    if len(ranks) > world_size:  # a mesh: several processes per data-parallel rank
        return f"Running: {counts['running']:,} of {len(ranks):,} processes reporting"
    return f"Running: {counts['running']:,} of {world_size:,} ranks reporting"
