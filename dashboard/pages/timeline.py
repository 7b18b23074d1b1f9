"""Timeline: checkpoints saved, resumes (with the world size before and after), epochs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    if run_id is None:
        return
    items = ui.fetch("timeline", run_id)
    if items is None:
        return
    if not items:
        st.caption("No checkpoint, resume or epoch end yet.")
        return
    ui.show(charts.timeline_chart(items))
    frame = pd.DataFrame(items)
    frame["time"] = pd.to_datetime(frame["ts"], unit="s").dt.strftime("%H:%M:%S")
    st.table(frame[["time", "label", "ranks"]].iloc[::-1].set_index("time"))


ui.framed()
st.header("Timeline")
live()
