"""Throughput: rows/s per rank, data wait per step, and who is straggling."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui

WINDOWS = {"last 5 min": 300, "last 30 min": 1800, "last 2 h": 7200, "last 24 h": 86400}


@st.fragment(run_every=ui.REFRESH)
def live(window_s: int) -> None:
    run_id = ui.selected_run()
    if run_id is None:
        return
    data = ui.fetch("throughput", run_id, window_s=window_s, points=120)
    if data is None:
        return
    if data["stragglers"]:
        st.error("Stragglers: " + ", ".join(f"rank {s['rank']}" for s in data["stragglers"]))
        st.table(pd.DataFrame(data["stragglers"]).set_index("rank"))
    else:
        st.success("No straggler in the last 30 s.")
    samples = data["data"]
    ui.show(charts.series_chart(samples, "rows_per_s", "rows/s"))
    ui.show(charts.series_chart(samples, "wait_per_step_s", "data wait per step (s)"))
    st.caption(f"{data['count']:,} points, {data['bucket_s']:.0f} s per point")


ui.framed()
st.header("Throughput")
choice = st.radio("window", list(WINDOWS), horizontal=True, label_visibility="collapsed")
live(WINDOWS[choice])
