"""Streamlit entrypoint: the picture frame (title, run picker, status line) and the router.

Pages live in `screens/`, not `pages/`: a `pages/` folder beside the entrypoint switches
Streamlit to its older multipage mode, in which a first visit to `/progress` ran the page
without this frame. The run is in the URL (`?run=`) so a link opens the same run and page.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import ui

SCREENS = Path(__file__).with_name("screens")

st.set_page_config(page_title="elastic-loader", page_icon=":material/grid_view:", layout="wide")


@st.fragment(run_every="3s")
def _run_picker() -> None:
    """Refreshes the run list every few seconds so a job that just started shows up."""
    listed, _ = ui.runs()
    if not listed:
        if listed is not None:  # (collector down: the status line says so, once)
            st.caption("no runs")
        return
    ids = [str(r["run_id"]) for r in listed]
    current = ui.selected_run()
    if current is None:
        current = ids[0]
        ui.choose(current)
    index = ids.index(current) if current in ids else None
    choice = st.selectbox("Run", ids, index=index, placeholder="run not found: pick one")
    if choice is not None and choice != current:
        ui.choose(choice)
    st.caption(f"collector: {ui.client().base_url}")


@st.fragment(run_every=ui.REFRESH)
def _status() -> None:
    ui.status_line()


with st.sidebar:
    st.title("elastic-loader")
    _run_picker()
if run := ui.selected_run():
    st.query_params[ui.RUN] = run  # keep the run in the URL across page switches

page = st.navigation(
    [
        st.Page(
            SCREENS / "placement.py", title="Placement", icon=":material/grid_view:", default=True
        ),
        st.Page(
            SCREENS / "progress.py",
            title="Progress",
            icon=":material/donut_large:",
            url_path="progress",
        ),
        st.Page(
            SCREENS / "throughput.py",
            title="Throughput",
            icon=":material/speed:",
            url_path="throughput",
        ),
        st.Page(
            SCREENS / "timeline.py",
            title="Timeline",
            icon=":material/timeline:",
            url_path="timeline",
        ),
        st.Page(
            SCREENS / "planner.py", title="Planner", icon=":material/calculate:", url_path="planner"
        ),
    ]
)
if page.url_path != "planner":
    _status()
page.run()
