"""Placement: which rank reads which split, now and (after a resume) before."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, ui


def _rank_table(layout: dict[str, Any], rows_per_split: int) -> pd.DataFrame:
    rows = []
    for r in layout["ranks"]:
        lo, hi = (r["splits"] or [0, 0])[:2]
        total = (hi - lo) * rows_per_split
        read = sum(r["cursors"] or [])
        rows.append(
            {
                "rank": f"rank {r['rank']}",
                "host": r["host"],
                "GPU": r["local_rank"],
                "workers": r["num_workers"],
                "splits": f"{lo}–{hi - 1}" if hi > lo else "—",
                "step": r["step"],
                "read": f"{100 * read / total:.1f}%" if total else "—",
                "rows/s": f"{r['rows_per_s']:,.0f}",
            }
        )
    return pd.DataFrame(rows)


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    if run_id is None:
        return
    placement = ui.fetch("placement", run_id)
    run = ui.fetch("progress", run_id)
    if placement is None or run is None:
        return
    cur, prev = placement["current"], placement["previous"]
    num_splits = placement["num_splits"]
    st.markdown(
        f"**{run_id}** · S = {num_splits} splits · W = {cur['world_size']} ranks · "
        f"world sizes S supports: {', '.join(map(str, placement['supported_world_sizes']))}"
    )
    now = charts.placement_grid(cur, num_splits, f"now: W = {cur['world_size']}")
    if prev:
        before_col, after_col = st.columns(2)
        before = charts.placement_grid(prev, num_splits, f"before resume: W = {prev['world_size']}")
        ui.show(before, before_col, fit=False)
        ui.show(now, after_col, fit=False)
    else:
        ui.show(now, fit=False)
    st.subheader("Ranks")
    table = _rank_table(cur, run["rows_per_split"])
    if table.empty:
        st.caption("no rank has reported in this world size yet")
    else:
        st.table(table.set_index("rank"))


ui.framed()
st.header("Placement")
st.caption(
    "Each cell is a split, coloured by the rank (GPU) that reads it; hover for host and workers."
)
live()
