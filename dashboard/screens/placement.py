"""Placement: which rank reads which split, now and (after a resume) before; who is silent;
which splits two ranks share and who reads which part (the layout is `loader.layout`'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, nodes, ui
from loader.layout import slice_bounds

# Worst first: silent ranks, then the ones furthest behind.
ORDER = {"crashed": 0, "stalled": 1, "running": 2, "closed": 3}
NODES_FROM = 32  # ranks beyond which a per-node table answers "is anyone behind"
# beyond nodes.GROUP_FROM ranks: per node rows and one node drawn instead of the split grid


def shared_table(layout: dict[str, Any]) -> pd.DataFrame:
    """One row per split that several ranks read: who reads which rows of each step's."""
    per = layout["rows_per_step"]
    rows = [
        {
            "split": f"split {s['split']:,}",
            "read by": " · ".join(
                f"rank {p['rank']}: rows {p['start']}–{p['stop'] - 1}" for p in s["parts"]
            ),
            "of each step's": f"{per:,} rows",
        }
        for s in layout["shared"]
    ]
    return pd.DataFrame(rows).set_index("split") if rows else pd.DataFrame(rows)


def rank_table(
    layout: dict[str, Any],
    rows_per_split: int,
    reads: Callable[[dict[str, Any]], str] | None = None,
) -> pd.DataFrame:
    """One row per rank, human labels, worst first. A packed run's cursors count blocks, up
    to the rank's `blocks_per_split` (its rows/s are blocks/s). Splits the rank shares with
    another are marked with a *; `reads(rank)`, when given, says instead what it reads (a
    mixture: the positions of each step)."""
    shared = {s["split"] for s in layout["shared"]}
    rows = []
    for r in layout["ranks"]:
        lo, hi = (r["splits"] or [0, 0])[:2]
        pct = nodes.read_pct(r, rows_per_split)
        rows.append(
            {
                "order": (ORDER.get(r["state"], 4), pct or 0.0, r["rank"]),
                "rank": r.get("replicas") or f"rank {r['rank']}",  # "dp 0: ranks 0, 1 (tp)"
                "state": r["state"],
                "last seen": ui.ago(r["silent_s"]),
                "host": ui.plain(r["host"]),  # st.table renders Markdown
                "GPU": r["gpu"],
                "workers": r["num_workers"],
                "splits": reads(r) if reads else _splits(lo, hi, shared),
                "global step": f"{r['global_step']:,}" if r["global_step"] is not None else "—",
                "read": f"{pct:.1f}%" if pct is not None else "—",
                "rows/s": f"{r['rows_per_s']:,.0f}" if r["state"] == "running" else "—",
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values("order").drop(columns="order").set_index("rank")


def _splits(lo: int, hi: int, shared: set[int]) -> str:
    if hi <= lo:
        return "—"
    star = {s: "*" if s in shared else "" for s in (lo, hi - 1)}
    return f"{lo}{star[lo]}" if hi - lo == 1 else f"{lo}{star[lo]}–{hi - 1}{star[hi - 1]}"


def mixture_table(mixture: dict[str, Any]) -> pd.DataFrame:
    """One row per dataset of a mixture: weight, splits, where its rows sit in the step
    shown and which rank reads which of them."""
    rows = []
    for d in mixture["datasets"]:
        segments = d["segments"]
        rows.append(
            {
                "dataset": ui.plain(d["name"]),
                "weight": d["weight"],
                "splits": f"{d['splits']:,}",
                "positions": " · ".join(_span(g["start"], g["stop"]) for g in segments)
                or "none this step",
                "read by": " · ".join(
                    f"rank {p['rank']}: {_span(p['start'], p['stop'])}"
                    for g in segments
                    for p in g["parts"]
                )
                or "—",
            }
        )
    return pd.DataFrame(rows).set_index("dataset") if rows else pd.DataFrame(rows)


def _span(start: int, stop: int) -> str:
    """Positions [start, stop) as people write them: "5" or "2–4"."""
    return str(start) if stop - start == 1 else f"{start}–{stop - 1}"


def _mixture(run_id: str, placement: dict[str, Any]) -> None:
    """A mixture has no split grid: every rank reads a slice of every step, and each step
    holds rows of every dataset."""
    mixture, cur = placement["mixture"], placement["current"]
    count, world = len(mixture["datasets"]), cur["world_size"]
    per_step = mixture["rows_per_step"]
    st.text(
        f"{run_id} · a mixture of {count} datasets · "
        + (f"G = {per_step:,} rows a step · " if per_step else "")
        + f"W = {world:,} ranks · any world size up to G"
    )
    st.subheader("Datasets of the mixture")
    step = mixture["global_step"]
    st.caption(
        f"Rank r reads positions r·G/W to (r+1)·G/W − 1 of every global step; a step lays "
        f"out each dataset's rows in turn, so every rank reads a part of every dataset. "
        f"Positions of global step {step:,}" + " (the counts differ by at most one row a "
        "dataset from step to step)."
        if step is not None
        else "No step layout reported yet."
    )
    st.table(mixture_table(mixture))
    st.subheader("Ranks")
    table = rank_table(
        cur, placement["rows_per_split"], lambda r: _positions(r["rank"], world, per_step)
    )
    if table.empty:
        st.caption("no rank has reported in this world size yet")
        return
    table = table.drop(columns="read")  # a split's share: the Progress table has the datasets'
    query = st.session_state.get("placement-find", "")
    table = nodes.find(table, query).rename(columns={"splits": "positions of each step"})
    _table(table)


def _positions(rank: int, world_size: int, rows: int | None) -> str:
    """The positions of each step that `rank` reads (`loader.layout.slice_bounds`)."""
    if not rows:
        return "—"
    return _span(*slice_bounds(rank, world_size, rows))


def _world_sizes(placement: dict[str, Any]) -> str:
    up_to = placement["any_world_size_up_to"]
    if up_to:
        return f"any world size up to G = {up_to:,} (G is a multiple of S)"
    return f"world sizes S supports: {', '.join(map(str, placement['supported_world_sizes']))}"


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    placement = ui.fetch("placement", run_id)
    if placement is None:
        return
    if placement.get("mixture"):
        _mixture(placement["run_id"], placement)
        return
    cur, prev = placement["current"], placement["previous"]
    num_splits, per_split = placement["num_splits"], placement["rows_per_split"]
    big = len(cur["ranks"]) > nodes.GROUP_FROM
    if not big:
        st.caption(
            "Each cell is a split, coloured by the rank (GPU) that reads it; a split two ranks "
            "share is cut into their parts (and marked * in the ranks table); dark cells "
            "belong to a rank that stopped reporting. Hover for the part read, host, GPU, "
            "workers and state."
        )
    st.text(
        f"{run_id} · S = {num_splits:,} splits · W = {cur['world_size']:,} ranks · "
        + _world_sizes(placement)
        + (f" · before resume: W = {prev['world_size']:,}" if big and prev else "")
    )
    if big:
        _groups(cur, per_split)
    else:
        _grids(cur, prev, num_splits)
    if cur["shared"]:
        st.subheader("Shared splits")
        st.caption(
            "Each global step takes G/S rows of every split; where a rank's slice of the "
            "step ends inside a split, the next rank reads the rest of it."
        )
        _table(shared_table(cur))
    if NODES_FROM < len(cur["ranks"]) <= nodes.GROUP_FROM:
        st.subheader("Nodes")
        st.caption(_NODES_SAY)
        st.table(nodes.marked_cells(nodes.node_table(cur["ranks"], per_split, ui.plain)))
    st.subheader("Ranks")
    table = rank_table(cur, per_split)
    if table.empty:
        st.caption("no rank has reported in this world size yet")
        return
    query = st.session_state.get("placement-find", "")
    order = st.session_state.get("placement-sort", nodes.SORTS[0])
    found = nodes.sort_ranks(nodes.find(table, query), order)
    shown = f"{len(found):,} of {len(table):,} ranks" + (f" match “{query}”" if query else "")
    st.caption(shown + (" · click a column's header to sort by it" if big else ""))
    if big:
        _sortable(found)
    else:
        st.table(found)


_NODES_SAY = (
    "One row per node (per range of ranks when the hosts do not group them), the nodes with "
    "a rank to look at first: each names its ranks that are crashed, stalled, terminated "
    f"or behind (running, with over {nodes.BEHIND_PTS:g} point less read than the median "
    "rank) in that state's colour."
)


def _grids(cur: dict[str, Any], prev: dict[str, Any] | None, num_splits: int) -> None:
    """Up to `nodes.GROUP_FROM` ranks: every split, coloured by its rank (before and now)."""
    ranks = max(cur["world_size"], prev["world_size"] if prev else 0)  # one colour per rank
    now = charts.placement_grid(cur, num_splits, f"now: W = {cur['world_size']:,}", ranks)
    if prev:
        before_col, after_col = st.columns(2)
        title = f"before resume: W = {prev['world_size']:,}"
        ui.show(charts.placement_grid(prev, num_splits, title, ranks), before_col, fit=False)
        ui.show(now, after_col, fit=False)
    else:
        ui.show(now, fit=False)


def _groups(cur: dict[str, Any], per_split: int) -> None:
    """Beyond `nodes.GROUP_FROM` ranks: one row per node, and one node's ranks drawn."""
    found = nodes.groups(cur["ranks"], per_split)
    table = nodes.group_frame(found, ui.plain)
    what = table.index.name or "node"
    st.subheader(f"{'Nodes' if what == 'node' else 'Rank ranges'}, worst first")
    st.caption(_NODES_SAY)
    # 128 nodes scroll in their own box: the drawn node and the ranks stay near the top
    box = st.container(height=440) if len(table) > 12 else st.container()
    box.table(nodes.marked_cells(table))
    by_rank = sorted(found, key=lambda g: g.ranks[0])
    options = [g.name for g in by_rank]
    if st.session_state.get("placement-group") not in options:
        st.session_state["placement-group"] = found[0].name  # the worst node
    pick = st.selectbox(f"the ranks and splits of {what}", options, key="placement-group")
    group = next(g for g in by_rank if g.name == pick)
    late = nodes.behind(cur["ranks"], per_split)
    members = set(group.ranks)
    marks = {r["rank"]: nodes.mark(r, late) for r in cur["ranks"] if r["rank"] in members}
    title = f"{pick}: ranks {nodes.rank_spans(group.ranks)} · splits {group.splits}"
    ui.show(charts.group_grid(cur, group.ranks, marks, title), fit=False)


def _table(frame: pd.DataFrame) -> None:
    """A short table as it is; a long one scrolls and sorts (no pages to step through)."""
    if len(frame) <= nodes.GROUP_FROM:
        st.table(frame)
    else:
        st.dataframe(frame, height=420)


def _sortable(found: pd.DataFrame) -> None:
    """The ranks table as a grid that sorts by a header's click; every matching rank,
    scrolled (no pages). Plain cells: a Styler's colours cost 0.2 s a second at 1,024 ranks
    (the nodes table above colours the marked ranks)."""
    number = st.column_config.NumberColumn
    config = {
        "rank": number(format="%d"),
        "read %": number(format="%.1f%%"),
        "global step": number(format="localized"),
        "rows/s": number(format="localized"),
    }
    st.dataframe(nodes.sortable(found), hide_index=True, height=420, column_config=config)


def _find_box() -> None:
    """Outside the refreshing fragment: what is typed survives each refresh."""
    find, order = st.columns([3, 2])
    find.text_input("find a rank, host or state", key="placement-find", placeholder="17, node3")
    order.radio("sort ranks by", nodes.SORTS, key="placement-sort", horizontal=True)


st.header("Placement")
_find_box()
live()
