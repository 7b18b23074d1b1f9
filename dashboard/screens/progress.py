"""Progress: the job (epoch x of N, ETA), the epoch (cursors per split), every rank's share."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, ui

BARS_UP_TO = 32  # ranks drawn as bars; beyond, a heatmap and the ranks furthest behind


def _headline(progress: dict[str, Any]) -> None:
    job = progress["job"]
    state, epoch, pct, rate, eta, job_eta = st.columns(6)
    state.metric("state", progress["state"])
    epoch_label = job["label"] or (
        f"epoch {progress['epoch']}" if progress["epoch"] is not None else "—"
    )
    epoch.metric("position", epoch_label)
    pct.metric("epoch read", f"{progress['epoch_pct']:.1f}%")
    rate.metric("rows/s (running ranks)", f"{progress['rows_per_s']:,.0f}")
    eta.metric(
        "epoch ETA", "done" if progress["state"] == "finished" else ui.duration(progress["eta_s"])
    )
    job_eta.metric("job ETA", "done" if job["eta_s"] == 0 else ui.duration(job["eta_s"]))
    step = progress["global_step"]
    step_text = f" · global step {step:,}" if step is not None else ""
    st.progress(
        min(1.0, progress["epoch_pct"] / 100),
        text=f"{progress['rows_done']:,} rows read by the ranks' bars below{step_text}",
    )
    if job["pct"] is not None:
        st.progress(min(1.0, job["pct"] / 100), text=f"job: {job['label']} · {job['pct']:.1f}%")


def _behind(ranks: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(ranks).sort_values(["pct", "rank"])
    return pd.DataFrame(
        {
            "rank": [f"rank {r}" for r in frame["rank"]],
            "state": frame["state"],
            "read": [f"{p:.1f}%" for p in frame["pct"]],
            "global step": [f"{g:,.0f}" if pd.notna(g) else "—" for g in frame["global_step"]],
        }
    ).set_index("rank")


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    progress = ui.fetch("progress", run_id) if run_id else None
    if progress is None:
        return
    _headline(progress)
    ranks = progress["ranks"]
    grid, side = st.columns([3, 2])
    ui.show(charts.progress_grid(progress), grid, fit=False)
    if len(ranks) > BARS_UP_TO:
        ui.show(charts.rank_heatmap(ranks), side, fit=False)
        st.subheader("Ranks furthest behind")
        st.table(ui.paged(_behind(ranks), "progress-page"))
        return
    if ranks:
        ui.show(charts.rank_bars(ranks), side)
    for r in ranks:
        step = r["global_step"] if r["global_step"] is not None else r["step"]
        st.progress(
            min(1.0, r["pct"] / 100),
            text=f"rank {r['rank']}: {r['pct']:.1f}% · step {step or 0:,}",
        )


st.header("Progress")
live()
