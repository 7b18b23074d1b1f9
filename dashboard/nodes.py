"""Placement at 64-1,024 processes: one row per node (host) instead of a grid no one can
read rank by rank, with the ranks that are behind named; and the ranks table's search.

Pandas and the standard library only (the Streamlit process draws it; no collector import).
A rank is *behind* when it is silent (crashed, stalled) or has read more than `BEHIND_PTS`
percentage points less of its splits than the run's median rank.
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

BEHIND_PTS = 1.0
SILENT = ("crashed", "stalled")


def read_pct(rank: dict[str, Any], rows_per_split: int) -> float | None:
    """The share (%) of its splits a rank has read this epoch (packed: of its blocks)."""
    lo, hi = (rank["splits"] or [0, 0])[:2]
    total = (hi - lo) * (rank.get("blocks_per_split") or rows_per_split)
    return 100 * sum(rank["cursors"] or []) / total if total else None


def rank_spans(ranks: list[int]) -> str:
    """Sorted rank numbers as people write them: "0–7", "0–3, 5, 9–11"."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in spans)


def behind(ranks: list[dict[str, Any]], rows_per_split: int) -> set[int]:
    """The ranks that are silent or more than `BEHIND_PTS` points under the median read."""
    pct = {r["rank"]: read_pct(r, rows_per_split) for r in ranks}
    known = [p for p in pct.values() if p is not None]
    median = statistics.median(known) if known else None
    return {
        r["rank"]
        for r in ranks
        if r["state"] in SILENT
        or (median is not None and (p := pct[r["rank"]]) is not None and p < median - BEHIND_PTS)
    }


def node_table(ranks: list[dict[str, Any]], rows_per_split: int, host: Any = str) -> pd.DataFrame:
    """One row per host, nodes holding a rank that is behind first: its ranks, their states,
    the range of what they read and who is behind. `host` makes a host name safe to show."""
    late = behind(ranks, rows_per_split)
    by_host: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        by_host.setdefault(str(r.get("host") or "?"), []).append(r)
    rows = []
    for name, members in by_host.items():
        numbers = sorted(r["rank"] for r in members)
        states: dict[str, int] = {}
        for r in members:
            states[r["state"]] = states.get(r["state"], 0) + 1
        pcts = [p for r in members if (p := read_pct(r, rows_per_split)) is not None]
        slow = [n for n in numbers if n in late]
        rows.append(
            {
                "order": (not slow, numbers[0]),
                "node": host(name),
                "ranks": rank_spans(numbers),
                "states": " · ".join(f"{n:,} {s}" for s, n in sorted(states.items())),
                "read": f"{min(pcts):.1f}–{max(pcts):.1f}%" if pcts else "—",
                "behind": ", ".join(f"rank {n}" for n in slow) or "—",
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values("order").drop(columns="order").set_index("node")


def find(frame: pd.DataFrame, query: str) -> pd.DataFrame:
    """The rows of a ranks table that match `query`: a number is a rank ("17" is rank 17,
    not 170), other text is looked for, case-insensitive, in every cell."""
    query = query.strip()
    if not query or frame.empty:
        return frame
    if query.isdigit():
        return frame[frame.index.astype(str).str.fullmatch(rf"(rank )?{int(query)}")]
    text = frame.astype(str).apply(" ".join, axis=1) + " " + frame.index.astype(str)
    return frame[text.str.contains(query, case=False, regex=False)]


SORTS = ("worst first", "rank", "host", "read")


def sort_ranks(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    """A worst-first ranks table in the order the user picked (`SORTS`): by rank number (the
    first number of "rank 17" or "dp 0: ranks 0, 1 (tp)"), by host, or least read first."""
    if by not in SORTS:
        raise ValueError(f"sort by {by!r}: pick one of {', '.join(SORTS)}")
    if by == "worst first" or frame.empty:
        return frame
    number = frame.index.astype(str).str.extract(r"(\d+)", expand=False).astype(float)
    keys = pd.DataFrame({"rank": number.to_numpy()}, index=frame.index)
    if by == "host":
        keys.insert(0, "host", frame["host"].astype(str))
    if by == "read":
        read = frame["read"].astype(str).str.rstrip("%").replace("—", "nan").astype(float)
        keys.insert(0, "read", read.to_numpy())
    order = keys.reset_index(drop=True).sort_values(list(keys.columns), na_position="last")
    return frame.iloc[order.index]
