"""Streamlit entrypoint: the picture frame (title, run picker) and the page router only."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import ui

PAGES = Path(__file__).with_name("pages")

st.set_page_config(page_title="elastic-loader", page_icon=":material/grid_view:", layout="wide")


@st.fragment(run_every="3s")
def _run_picker() -> None:
    """Refreshes the run list every few seconds so a job that just started shows up."""
    ids = [r["run_id"] for r in ui.runs()]
    if not ids:
        st.caption("no runs yet")
        return
    current = st.session_state.get("run_id")
    index = ids.index(current) if current in ids else 0
    st.session_state["run_id"] = st.selectbox("Run", ids, index=index)
    st.caption(f"collector: {ui.client().base_url}")


st.session_state[ui.FRAMED] = True
with st.sidebar:
    st.title("elastic-loader")
    _run_picker()

page = st.navigation(
    [
        st.Page(
            PAGES / "placement.py", title="Placement", icon=":material/grid_view:", default=True
        ),
        st.Page(
            PAGES / "progress.py",
            title="Progress",
            icon=":material/donut_large:",
            url_path="progress",
        ),
        st.Page(
            PAGES / "throughput.py",
            title="Throughput",
            icon=":material/speed:",
            url_path="throughput",
        ),
        st.Page(
            PAGES / "timeline.py", title="Timeline", icon=":material/timeline:", url_path="timeline"
        ),
        st.Page(
            PAGES / "planner.py", title="Planner", icon=":material/calculate:", url_path="planner"
        ),
    ]
)
page.run()
