"""Placement at 64-1,024 processes: one row per node (host), or per fixed range of ranks
when the hosts do not group them, instead of a split grid no one can read rank by rank: its
ranks, their splits, the min / median / max they read, and the ranks that are crashed,
stalled, terminated or behind named in their state's colour; and the ranks table's search,
sorts and sortable (numeric) form.

Pandas and the standard library only (the Streamlit process draws it; no collector import).
A rank is *behind* when it is silent (crashed, stalled) or has read more than `BEHIND_PTS`
percentage points less of its splits than the run's median rank.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dashboard.palette import cell_style

BEHIND_PTS = 1.0
SILENT = ("crashed", "stalled")
GROUP_FROM = 64  # ranks beyond which Placement draws one row per node, not a split grid
GROUP_MAX = 64  # the most ranks of a host that one row names; beyond: rank ranges
RANGE = 32  # ranks per row when the hosts do not group them
MARKS = ("crashed", "stalled", "terminated", "behind")  # worst first


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


@dataclass(frozen=True)
class Group:
    """One row of the aggregated placement: a node (host) or a fixed range of ranks."""

    name: str  # "node2", or "ranks 64–95"
    ranks: list[int]
    splits: str  # the splits its ranks read, as spans: "64–95"
    states: dict[str, int]  # state -> how many of its ranks
    read: tuple[float, float, float] | None  # min, median, max % of their splits read
    marked: dict[str, list[str]]  # MARKS -> the ranks in that state ("rank 17 (4.9%)")
    kind: str = "node"  # or "rank range"

    @property
    def worst(self) -> int:
        """The index in MARKS of its worst mark (len(MARKS) when none)."""
        return min((MARKS.index(m) for m, who in self.marked.items() if who), default=len(MARKS))


def mark(rank: dict[str, Any], late: set[int]) -> str | None:
    """What a rank is marked with on the aggregated view: its silent state, 'behind', None."""
    if rank["state"] in MARKS:
        return str(rank["state"])
    return "behind" if rank["rank"] in late else None


def group_of(ranks: list[dict[str, Any]]) -> tuple[str, dict[int, str]]:
    """What groups the ranks ("node" or "rank range") and each rank's group: its host when
    the hosts cut the run into groups of at most `GROUP_MAX` ranks, else fixed ranges of
    `RANGE` ranks ("ranks 64–95": one host, or hosts of more ranks than a row can name)."""
    per_host: dict[str, int] = {}
    for r in ranks:
        per_host[str(r.get("host") or "?")] = per_host.get(str(r.get("host") or "?"), 0) + 1
    if len(per_host) > 1 and max(per_host.values()) <= GROUP_MAX:
        return "node", {r["rank"]: str(r.get("host") or "?") for r in ranks}
    top = max((r["rank"] for r in ranks), default=0)
    return "rank range", {
        r["rank"]: f"ranks {lo:,}–{min(lo + RANGE - 1, top):,}"
        for r in ranks
        for lo in [r["rank"] // RANGE * RANGE]
    }


def groups(ranks: list[dict[str, Any]], rows_per_split: int) -> list[Group]:
    """The aggregated placement, groups with the worst marked rank first (crashed, stalled,
    terminated, behind), then by their first rank. O(W log W + S)."""
    late, (kind, named) = behind(ranks, rows_per_split), group_of(ranks)
    members: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(ranks, key=lambda r: r["rank"]):
        members.setdefault(named[r["rank"]], []).append(r)
    out = []
    for name, its in members.items():
        states: dict[str, int] = {}
        marked: dict[str, list[str]] = {m: [] for m in MARKS}
        splits: set[int] = set()
        for r in its:
            states[r["state"]] = states.get(r["state"], 0) + 1
            lo, hi = (r["splits"] or [0, 0])[:2]
            splits.update(range(lo, hi))
            if (m := mark(r, late)) is not None:
                pct = read_pct(r, rows_per_split)
                marked[m].append(
                    f"rank {r['rank']}" + (f" ({pct:.1f}%)" if pct is not None else "")
                )
        pcts = [p for r in its if (p := read_pct(r, rows_per_split)) is not None]
        read = (min(pcts), statistics.median(pcts), max(pcts)) if pcts else None
        ranks_of = [r["rank"] for r in its]
        spans = rank_spans(list(splits)) or "—"
        out.append(Group(name, ranks_of, spans, states, read, marked, kind))
    return sorted(out, key=lambda g: (g.worst, g.ranks[0]))


def node_table(ranks: list[dict[str, Any]], rows_per_split: int, host: Any = str) -> pd.DataFrame:
    """One row per group (`groups`), worst first: its ranks and splits, their states, the
    min / median / max they read, and one column per mark naming the ranks it holds. `host`
    makes a host name safe to show. `marked_cells` colours the named ones."""
    return group_frame(groups(ranks, rows_per_split), host)


def group_frame(found: list[Group], host: Any = str) -> pd.DataFrame:
    """`node_table` of groups already found."""
    rows = [
        {
            g.kind: host(g.name),
            "ranks": rank_spans(g.ranks),
            "splits": g.splits,
            "states": " · ".join(f"{n:,} {s}" for s, n in sorted(g.states.items())),
            "read min / median / max": " / ".join(f"{p:.1f}%" for p in g.read) if g.read else "—",
        }
        | {m: _names(g.marked[m]) for m in MARKS}
        for g in found
    ]
    frame = pd.DataFrame(rows)
    return frame.set_index(frame.columns[0]) if rows else frame


def _names(ranks: list[str], most: int = 8) -> str:
    """Up to `most` ranks named, then how many more ("—" for none)."""
    more = f", and {len(ranks) - most:,} more" if len(ranks) > most else ""
    return ", ".join(ranks[:most]) + more if ranks else "—"


def marked_cells(frame: pd.DataFrame) -> Any:
    """The node table as a pandas Styler: a cell naming ranks in its mark's colour."""

    def paint(column: pd.Series) -> list[str]:
        return ["" if v == "—" else cell_style(str(column.name)) for v in column]

    present = [m for m in MARKS if m in frame.columns]
    return frame.style.apply(paint, subset=present)


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


NUMBERS = {"global step": "global step", "read": "read %", "rows/s": "rows/s"}


def sortable(frame: pd.DataFrame) -> pd.DataFrame:
    """A ranks table (`screens.placement.rank_table`) for `st.dataframe`, whose header
    clicks sort: the rank a number of its own column, and "1,250", "10.0%", "—" as numbers
    (NaN for "—"), so 9 sorts before 10 and 9.5 % before 10.0 %."""
    out = frame.reset_index()
    label = out.columns[0]
    number = out[label].astype(str).str.extract(r"(\d+)", expand=False).astype(float)
    if out[label].astype(str).str.fullmatch(r"rank \d+").all():
        out = out.drop(columns=label)  # "rank 17": the number says it all
    out.insert(0, "rank", number.astype("Int64"))
    for column, name in NUMBERS.items():
        if column in out:
            text = out[column].astype(str).str.replace(r"[,%]", "", regex=True)
            out[column] = pd.to_numeric(text.replace("—", "nan"), errors="coerce")
            out = out.rename(columns={column: name})
    return out
