"""Timeline: checkpoints (with their path), resumes, epoch ends, outages and a crash,
placed by time and labelled by global step; below, a run's attempts (crash, resume)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui


@st.fragment(run_every=ui.REFRESH)
def live(by_step: bool) -> None:
    run_id = ui.selected_run()
    items = ui.fetch("timeline", run_id)
    if items is None:
        return
    if not items:
        st.caption("No checkpoint, resume or epoch end yet.")
        return
    ui.show(charts.timeline_chart(items, by_step))
    frame = pd.DataFrame(
        {
            "time (UTC)": [ui.clock(i["ts"]) for i in items],
            "event": [i["label"] for i in items],
            "global step": [f"{i['step']:,}" if i["step"] is not None else "—" for i in items],
            "checkpoint": [ui.plain(i["path"]) if i["path"] else "—" for i in items],
            "ranks": [i["ranks"] or "—" for i in items],
        }
    )
    st.table(frame.iloc[::-1].set_index("time (UTC)"))


@st.fragment(run_every=ui.REFRESH)
def attempts() -> None:
    """A run's attempts (a crash and the resume from its checkpoint are two), when it has
    more than one: when each ran and how its processes ended."""
    run_id = ui.selected_run()
    tried = ui.fetch("attempts", run_id)
    if not tried or len(tried) < 2:
        return
    st.subheader("Attempts")
    ended = [", ".join(f"{n} {why}" for why, n in sorted(a["ended"].items())) for a in tried]
    frame = pd.DataFrame(
        {
            "attempt": [f"{i + 1}: {ui.plain(a['attempt'])}" for i, a in enumerate(tried)],
            "from (UTC)": [ui.clock(a["first_ts"]) for a in tried],
            "to (UTC)": [ui.clock(a["last_ts"]) for a in tried],
            "ranks": [a["world_size"] for a in tried],
            "processes ended": ended,  # `silent`: sent no `closed` (killed, or still running)
        }
    )
    st.table(frame.set_index("attempt"))


st.header("Timeline")
axis = st.radio("axis", ["time", "global step"], horizontal=True, label_visibility="collapsed")
live(axis == "global step")
attempts()
