"""Streamlit glue shared by the pages: the collector client, the chosen run, the status line.

The run lives in the URL (`?run=<id>`) and in `st.session_state["run_id"]`: a link opens the
same run on the same page, and the pages' live fragments read it on every tick. The status
line at the top of every page is the one place that says what is wrong (collector down, no
runs, unknown run); pages then simply draw nothing.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import altair as alt
import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from dashboard.client import CollectorClient, CollectorError, settings_from_env

REFRESH = "1s"
RUN = "run"  # the URL's query parameter
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$:])")


def client() -> CollectorClient:
    """The client of the environment's collector: one per (URL, token), so a process
    that serves pages for another collector later (tests, a changed setting) reads that one."""
    return _client(*settings_from_env())


@st.cache_resource
def _client(url: str, token: str | None) -> CollectorClient:
    return CollectorClient(url, token)


def plain(text: Any) -> str:
    """User text (run ids, hosts) made inert for Markdown: shown as typed, never a link or
    an image the browser would fetch."""
    return _MARKDOWN.sub(r"\\\1", str(text))


def runs() -> tuple[list[dict[str, Any]] | None, str]:
    """The collector's runs, or None and why not."""
    try:
        return client().runs(), ""
    except CollectorError as exc:
        return None, str(exc)


def selected_run() -> str | None:
    """The run chosen in the sidebar, else the one the URL named when the session began
    (kept: switching pages clears the URL's query)."""
    if not st.session_state.get("run_id") and st.query_params.get(RUN):
        st.session_state["run_id"] = st.query_params[RUN]
    run_id = st.session_state.get("run_id")
    return str(run_id) if run_id else None


def choose(run_id: str) -> None:
    st.session_state["run_id"] = run_id
    st.query_params[RUN] = run_id


def fetch(view: str, run_id: str | None, **params: Any) -> Any:
    """`client().<view>(run_id)`, or None: no run chosen, or the collector did not answer (the
    status line says why; the next tick retries)."""
    if not run_id:
        return None
    try:
        return getattr(client(), view)(run_id, **params)
    except CollectorError:
        return None


def clock(ts: float | None) -> str:
    """A UTC time of day on the 24-hour clock, as on the charts' axes."""
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%H:%M:%S")


def ago(seconds: float | None) -> str:
    """'41 s ago', '3 min ago', '2 h 05 min ago'."""
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)  # a rank's clock a little ahead of this one's
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    minutes = int(seconds // 60)
    return (
        f"{minutes} min ago" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min ago"
    )


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def status_line() -> str | None:
    """Say, once, what state the run (or the collector) is in; return the run to draw."""
    listed, why = runs()
    if listed is None:
        st.error(
            f"Collector unreachable at {client().base_url} ({why}). Start it with "
            "`elastic-loader dashboard`, or point `ELASTIC_LOADER_DASHBOARD_API` at it."
        )
        return None
    if not listed:
        st.info(
            f"No runs yet. Start training with `ELASTIC_LOADER_TELEMETRY={client().base_url}` "
            "(and `ELASTIC_LOADER_RUN_ID=<name>`) in every rank's environment."
        )
        return None
    run_id = selected_run()
    if run_id is None:
        run_id = str(listed[0]["run_id"])
    if all(r["run_id"] != run_id for r in listed):
        st.error(
            f"Run “{plain(run_id)}” is not on this collector ({len(listed)} runs are): "
            "pick one in the sidebar."
        )
        return None
    status = fetch("status", run_id)
    if status is not None:
        _banner(status)
    return run_id


_BANNERS = {"running": st.success, "stalled": st.warning, "crashed": st.error}


def _banner(status: dict[str, Any]) -> None:
    seen = f"last report {clock(status['last_ts'])} UTC ({ago(status['now'] - status['last_ts'])})"
    resumed = " · resumed from a checkpoint" if status["resumed"] else ""
    draw = _BANNERS.get(status["state"], st.info)
    draw(f"**{status['headline']}** · {seen}{resumed}")


def show(
    chart: alt.Chart | alt.LayerChart, where: DeltaGenerator | None = None, fit: bool = True
) -> None:
    """Draw a chart across the page (`fit`) or at its own size (split grids: with
    `width="stretch"` Streamlit's autosize squeezed their plot area to a strip).

    The spec is built without Altair's JSON-schema validation (the charts are fixed code,
    checked once by the tests): at 4,096 splits it halves the page's server time."""
    spec = chart.to_dict(validate=False)
    draw = st.vega_lite_chart if where is None else where.vega_lite_chart
    draw(spec=spec, width="stretch" if fit else "content")
