"""Streamlit glue shared by the pages: the cached collector client and the chosen run.

The entrypoint picks the run in the sidebar and stores it in `st.session_state["run_id"]`;
pages' live fragments read it on every tick, so switching runs needs no page reload.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from dashboard.client import CollectorClient, CollectorError

REFRESH = "1s"
FRAMED = "_framed"


def framed() -> None:
    """Send a page run that bypassed the entrypoint through it.

    With `pages/` beside `app.py`, Streamlit runs a sub-page URL's script directly (its v1
    multipage mode) until some session has run `st.navigation`: the first visit after
    start-up would lose the sidebar and the wide layout.
    """
    if not st.session_state.get(FRAMED):
        st.switch_page("app.py")


@st.cache_resource
def client() -> CollectorClient:
    return CollectorClient.from_env()


def runs() -> list[dict[str, Any]]:
    try:
        return client().runs()
    except CollectorError as exc:
        st.error(f"Collector unreachable: {exc}")
        return []


def selected_run() -> str | None:
    """The sidebar's choice, else the most recently active run, else None (with a hint)."""
    run_id = st.session_state.get("run_id")
    if run_id:
        return str(run_id)
    listed = runs()
    if not listed:
        st.info(
            f"No runs yet. Start training with `ELASTIC_LOADER_TELEMETRY={client().base_url}` "
            "(and `ELASTIC_LOADER_RUN_ID=<name>`) in every rank's environment."
        )
        return None
    return str(listed[0]["run_id"])


def fetch(view: str, run_id: str, **params: Any) -> Any:
    """`client().<view>(run_id)`, or None after showing why not (the next tick retries)."""
    try:
        return getattr(client(), view)(run_id, **params)
    except CollectorError as exc:
        st.warning(f"Waiting for the collector: {exc}")
        return None


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def show(
    chart: alt.Chart | alt.LayerChart, where: DeltaGenerator | None = None, fit: bool = True
) -> None:
    """Draw a chart across the page (`fit`) or at its own size (split grids: with
    `width="stretch"` Streamlit's autosize squeezed their plot area to a strip)."""
    draw = st.altair_chart if where is None else where.altair_chart
    draw(chart, width="stretch" if fit else "content")
