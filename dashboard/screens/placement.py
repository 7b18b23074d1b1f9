"""Placement: which rank reads which split, now and (after a resume) before; who is silent."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, ui

# Worst first: silent ranks, then the ones furthest behind.
ORDER = {"crashed": 0, "stalled": 1, "running": 2, "closed": 3}


def rank_table(layout: dict[str, Any], rows_per_split: int) -> pd.DataFrame:
    """One row per rank, human labels, worst first. A packed run's cursors count blocks, up
    to the rank's `blocks_per_split` (its rows/s are blocks/s)."""
    rows = []
    for r in layout["ranks"]:
        lo, hi = (r["splits"] or [0, 0])[:2]
        total = (hi - lo) * (r.get("blocks_per_split") or rows_per_split)
        read = sum(r["cursors"] or [])
        rows.append(
            {
                "order": (ORDER.get(r["state"], 4), read / total if total else 0, r["rank"]),
                "rank": f"rank {r['rank']}",
                "state": r["state"],
                "last seen": ui.ago(r["silent_s"]),
                "host": ui.plain(r["host"]),  # st.table renders Markdown
                "GPU": r["gpu"],
                "workers": r["num_workers"],
                "splits": f"{lo}–{hi - 1}" if hi > lo else "—",
                "global step": f"{r['global_step']:,}" if r["global_step"] is not None else "—",
                "read": f"{100 * read / total:.1f}%" if total else "—",
                "rows/s": f"{r['rows_per_s']:,.0f}" if r["state"] == "running" else "—",
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values("order").drop(columns="order").set_index("rank")


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    placement = ui.fetch("placement", run_id) if run_id else None
    if placement is None:
        return
    cur, prev = placement["current"], placement["previous"]
    num_splits = placement["num_splits"]
    st.text(
        f"{run_id} · S = {num_splits:,} splits · W = {cur['world_size']:,} ranks · "
        f"world sizes S supports: {', '.join(map(str, placement['supported_world_sizes']))}"
    )
    now = charts.placement_grid(cur, num_splits, f"now: W = {cur['world_size']:,}")
    if prev:
        before_col, after_col = st.columns(2)
        title = f"before resume: W = {prev['world_size']:,}"
        ui.show(charts.placement_grid(prev, num_splits, title), before_col, fit=False)
        ui.show(now, after_col, fit=False)
    else:
        ui.show(now, fit=False)
    st.subheader("Ranks")
    table = rank_table(cur, placement["rows_per_split"])
    if table.empty:
        st.caption("no rank has reported in this world size yet")
    else:
        st.table(ui.paged(table, "placement-page"))


st.header("Placement")
st.caption(
    "Each cell is a split, coloured by the rank (GPU) that reads it; dark cells belong to a "
    "rank that stopped reporting. Hover for host, GPU, workers and state."
)
live()
