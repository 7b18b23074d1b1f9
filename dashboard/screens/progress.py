"""Progress: the job (epoch x of N, ETA), the epoch (cursors per split), every rank's share.

The headline ("epoch read") and the per-rank bars are drawn as one HTML element: Streamlit
replaces a fragment's elements one by one, and with short epochs a headline of the new
refresh beside bars of the old one read as a contradiction (0.0 % against 34.8 %).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from dashboard.mixture import mixture_frame

BARS_UP_TO = 32  # ranks drawn as bars; beyond, a heatmap and the ranks furthest behind
TRACK = "background:#e8eaed;height:8px;border-radius:4px;margin:2px 0 10px 0"


def _metrics(progress: dict[str, Any]) -> None:
    job = progress["job"]
    state, epoch, rate, eta, job_eta = st.columns(5)
    state.metric("state", progress["state"])
    ended = progress["state"] in ("finished", "stopped") and progress.get("epochs_done")
    position = job["label"] or (
        f"epochs {progress['epochs_done']} completed"
        if ended
        else f"epoch {progress['epoch'] + 1}"
        if progress["epoch"] is not None
        else "epoch —"
    )
    unit, _, where = position.partition(" ")  # "epoch", "2 of 3": fits a metric's width
    epoch.metric(unit, where)
    if progress.get("tokens_per_s") is not None:  # packed data: blocks of seq_len tokens
        rate.metric("tokens/s (running ranks)", f"{progress['tokens_per_s']:,.0f}")
    else:
        rate.metric("rows/s (running ranks)", f"{progress['rows_per_s']:,.0f}")
    finished = progress["state"] == "finished"
    eta.metric("epoch ETA", "done" if finished else ui.duration(progress["eta_s"]))
    job_eta.metric("job ETA", "done" if job["eta_s"] == 0 else ui.duration(job["eta_s"]))


def _bar(text: str, pct: float, colour: str, strong: bool = False) -> str:
    width = max(0.0, min(100.0, pct))
    label = f"<b>{text}</b>" if strong else text
    fill = f"width:{width:.1f}%;background:{colour};height:8px;border-radius:4px"
    return f'<div>{label}</div><div style="{TRACK}"><div style="{fill}"></div></div>'


def _tokens_text(progress: dict[str, Any]) -> str:
    """Packed data: ' · 12,288 tokens handed out (blocks of 2,048)'; else nothing."""
    if progress.get("tokens_done") is None:
        return ""
    return f" · {progress['tokens_done']:,} tokens handed out (blocks of {progress['seq_len']:,})"


def mixture_head(progress: dict[str, Any]) -> str:
    """A mixture's headline: its global step and ranks; what each dataset supplied is the
    table below (a mixture has no splits of its own, so no 'epoch read' of them)."""
    step = progress["global_step"]
    at = f"global step {step:,}" if step is not None else "no step yet"
    ranks = len(progress["ranks"])
    return f"<div><b>mixture · {at} · {ranks:,} rank{'s' if ranks != 1 else ''} reporting</b></div>"


def bars_html(progress: dict[str, Any], per_rank: bool) -> str:
    """The headline, the job's bar and (if `per_rank`) every rank's bar, in one element.
    Only numbers and fixed words (and mesh dim names, identifiers by the collector's
    schema): no user text goes into this HTML."""
    step = progress["global_step"]
    step_text = f" · global step {step:,}" if step is not None else ""
    owned = sum(r["rows_total"] for r in progress["ranks"])
    unit = progress.get("unit", "rows")
    head = f"epoch read {progress['epoch_pct']:.1f}% · {progress['rows_done']:,} of "
    head += f"{owned:,} {unit} the reporting ranks own{_tokens_text(progress)}{step_text}"
    if progress.get("skipped"):  # rows no rank reads this epoch, so each reads as many
        head += f" · {progress['skipped']:,} {unit} skipped for balance"
    parts = [_bar(head, progress["epoch_pct"], "#1565c0", strong=True)]
    job = progress["job"]
    if job["pct"] is not None:
        parts.append(_bar(f"job: {job['label']} · {job['pct']:.1f}%", job["pct"], "#6a1b9a"))
    for r in progress["ranks"] if per_rank else ():
        shown = r["global_step"] if r["global_step"] is not None else r["step"]
        who = r.get("replicas") or f"rank {r['rank']}"  # on a mesh: "dp 0: ranks 0, 1 (tp)"
        text = f"{who}: {r['pct']:.1f}% · step {shown or 0:,}"
        if r["state"] != "running":
            text += f" · {r['state']}"
        parts.append(_bar(text, r["pct"], charts.STATE_COLOURS.get(r["state"], "#9e9e9e")))
    return "<div>" + "".join(parts) + "</div>"


FURTHEST = 16  # ranks the "furthest behind" table lists (no pages: Placement finds any)


def _behind(ranks: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(ranks).sort_values(["pct", "rank"])
    return pd.DataFrame(
        {
            "rank": [
                rep if isinstance(rep, str) else f"rank {r}"
                for r, rep in zip(frame["rank"], frame.get("replicas", frame["rank"]), strict=True)
            ],
            "state": frame["state"],
            "read": [f"{p:.1f}%" for p in frame["pct"]],
            "global step": [f"{g:,.0f}" if pd.notna(g) else "—" for g in frame["global_step"]],
        }
    ).set_index("rank")


@st.fragment(run_every=ui.REFRESH)
def live() -> None:
    run_id = ui.selected_run()
    progress = ui.fetch("progress", run_id)
    if progress is None:
        return
    _metrics(progress)
    events = ui.fetch("events", run_id, kind="mixture")
    live = ui.fetch("events", run_id, kind="mixture_progress", limit=100) if events else None
    mixed = mixture_frame((events or []) + (live or []))
    if mixed is not None:  # a mixture: per dataset, from the loader's `mixture` events
        st.html(mixture_head(progress))
        st.subheader("Datasets of the mixture")
        st.table(mixed)
        return  # no splits of its own: no split grid, no per-split bars
    ranks = progress["ranks"]
    few = len(ranks) <= BARS_UP_TO
    st.html(bars_html(progress, per_rank=few))
    grid, side = st.columns([3, 2])
    ui.show(charts.progress_grid(progress), grid, fit=False)
    if not few:
        ui.show(charts.rank_heatmap(ranks), side, fit=False)
        st.subheader("Ranks furthest behind")
        behind = _behind(ranks)
        st.caption(
            f"the {min(FURTHEST, len(behind))} furthest behind of {len(behind):,} ranks; "
            "every rank is in Placement's ranks table (find, sort)"
        )
        st.table(behind.head(FURTHEST))
    elif ranks:
        ui.show(charts.rank_bars(ranks), side)


st.header("Progress")
live()
