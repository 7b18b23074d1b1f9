"""Progress: per-split cursors, epoch %, ETA at the current speed."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, ui


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    if run_id is None:
        return
    progress = ui.fetch("progress", run_id)
    if progress is None:
        return
    epoch, pct, rate, eta = st.columns(4)
    epoch.metric("epoch", progress["epoch"] if progress["epoch"] is not None else "—")
    pct.metric("epoch read", f"{progress['epoch_pct']:.1f}%")
    rate.metric("rows/s (all ranks)", f"{progress['rows_per_s']:,.0f}")
    eta.metric("epoch ETA", ui.duration(progress["eta_s"]))
    st.progress(
        min(1.0, progress["epoch_pct"] / 100),
        text=f"{progress['rows_done']:,} of {progress['rows_total']:,} rows",
    )
    grid, bars = st.columns([3, 2])
    ui.show(charts.progress_grid(progress), grid, fit=False)
    if progress["ranks"]:
        ui.show(charts.rank_bars(progress), bars)
    for r in progress["ranks"]:
        st.progress(
            min(1.0, r["pct"] / 100),
            text=f"rank {r['rank']}: {r['pct']:.1f}% · step {r['step']}",
        )


ui.framed()
st.header("Progress")
live()
