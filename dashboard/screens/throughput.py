"""Throughput: rows/s across ranks as a band, whether the GPU waits on data, stragglers."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, ui

WINDOWS = {"last 5 min": 300, "last 30 min": 1800, "last 2 h": 7200, "last 24 h": 86400}


def _pct(share: float) -> str:
    return f"{share:.0%}"


def _verdict(data: dict[str, Any], unit: str) -> None:
    verdict = data["input"]["verdict"]
    (st.warning if data["input"]["bound"] else st.success)(f"Data wait: {verdict}.")
    if data["stragglers"]:
        rows = [
            {
                "rank": f"rank {s['rank']}",
                unit: f"{s['rows_per_s']:,.0f}",
                "waiting for data": _pct(s["stall_frac"]),
                "why": s["reason"],
            }
            for s in data["stragglers"]
        ]
        st.error("Stragglers: " + ", ".join(r["rank"] for r in rows))
        st.table(pd.DataFrame(rows).set_index("rank"))
    else:
        st.success("No straggler in the last 30 s.")


@st.fragment(run_every=ui.REFRESH)
def live(window_s: int) -> None:
    run_id = ui.selected_run()
    data = ui.fetch("throughput", run_id, window_s=window_s, points=120) if run_id else None
    if data is None:
        return
    tokens_per_s = data.get("tokens_per_s")
    unit = "rows/s" if tokens_per_s is None else "blocks/s"  # packed: blocks of seq_len tokens
    _verdict(data, unit)
    if tokens_per_s is not None:
        st.metric("tokens/s (job, last 30 s)", f"{tokens_per_s:,.0f}")
    chart = charts.band_chart(
        data["band"], f"{unit} per rank", data["crashed_at"], data.get("crashed_before") or []
    )
    ui.show(chart)
    ui.show(charts.wait_chart(data["band"]))
    slowest = [
        {
            "rank": f"rank {s['rank']}",
            unit: f"{s['rows_per_s']:,.0f}",
            "waiting for data": _pct(s["wait_share"]),
        }
        for s in data["slowest"]
    ]
    if slowest:
        st.subheader("Slowest ranks in the window")
        st.table(pd.DataFrame(slowest).set_index("rank"))
    st.caption(f"{data['count']:,} points, {data['bucket_s']:.0f} s per point")


st.header("Throughput")
choice = st.radio("window", list(WINDOWS), horizontal=True, label_visibility="collapsed")
live(WINDOWS[choice or next(iter(WINDOWS))])
