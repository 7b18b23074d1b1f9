"""Altair charts built from the collector's JSON: pure functions, no Streamlit, testable.

Splits are drawn as a grid of at most `GRID_COLS` columns so that S = 8 and S = 4,096 both
read at a glance; the same geometry serves placement (colour = owning rank) and progress
(colour = cursor / rows per split), so the two pages line up cell for cell.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd

GRID_COLS = 64


def _cols(num_splits: int) -> int:
    return max(1, min(GRID_COLS, math.ceil(math.sqrt(num_splits * 4))))


def cell_px(num_splits: int) -> int:
    """Cells as large as fit ~400 px across (half a wide page), 6-40 px."""
    return max(6, min(40, 400 // _cols(num_splits)))


def split_frame(owner: list[int], cursors: list[int | None] | None = None) -> pd.DataFrame:
    """One row per split: its grid position, owning rank and (if known) cursor."""
    cols = _cols(len(owner))
    frame = pd.DataFrame(
        {
            "split": range(len(owner)),
            "rank": owner,
            "col": [s % cols for s in range(len(owner))],
            "row": [s // cols for s in range(len(owner))],
        }
    )
    frame["label"] = [f"r{r}" for r in owner]
    if cursors is not None:
        frame["cursor"] = [c if c is not None else -1 for c in cursors]
    return frame


def placement_grid(layout: dict[str, Any], num_splits: int, title: str) -> alt.LayerChart:
    """Splits coloured by the rank that reads them; tooltips name host, GPU and workers."""
    frame = split_frame(layout["owner"])
    by_rank = {r["rank"]: r for r in layout["ranks"]}
    frame["host"] = [by_rank.get(r, {}).get("host", "?") for r in frame["rank"]]
    frame["local_rank"] = [by_rank.get(r, {}).get("local_rank", -1) for r in frame["rank"]]
    frame["workers"] = [by_rank.get(r, {}).get("num_workers", 0) for r in frame["rank"]]
    base = alt.Chart(frame)
    cells = base.mark_rect(stroke="white").encode(
        x=alt.X("col:O", axis=None),
        y=alt.Y("row:O", axis=None),
        color=alt.Color(
            "rank:N",
            scale=alt.Scale(scheme="tableau20"),
            legend=alt.Legend(orient="bottom", columns=16, title="rank"),
        ),
        tooltip=["split:Q", "rank:N", "host:N", "local_rank:Q", "workers:Q"],
    )
    text = base.mark_text(fontSize=9, color="white").encode(x="col:O", y="row:O", text="label:N")
    # Labels stop being legible (and cost render time) beyond a few hundred cells.
    cell = cell_px(num_splits)
    layers = [cells, text] if cell >= 18 else [cells]  # labels only where they are legible
    step = alt.Step(cell)
    return alt.LayerChart(layer=layers, title=title).properties(width=step, height=step)


def progress_grid(progress: dict[str, Any]) -> alt.LayerChart:
    """Per-split cursor as a heatmap: 0 (white) to rows per split (dark); grey = unknown."""
    frame = split_frame(progress["owner"], progress["cursors"])
    per_split = max(1, progress["rows_per_split"])
    frame["done"] = [c / per_split if c >= 0 else None for c in frame["cursor"]]
    base = alt.Chart(frame).encode(x=alt.X("col:O", axis=None), y=alt.Y("row:O", axis=None))
    unknown = base.mark_rect(stroke="white", color="#dddddd").encode(tooltip=["split:Q", "rank:N"])
    known = (
        base.transform_filter("datum.cursor >= 0")
        .mark_rect(stroke="white")
        .encode(
            color=alt.Color("done:Q", scale=alt.Scale(domain=[0, 1], scheme="blues"), title="read"),
            tooltip=["split:Q", "rank:N", "cursor:Q", alt.Tooltip("done:Q", format=".1%")],
        )
    )
    step = alt.Step(cell_px(len(frame)))
    title = "cursor per split (share of the split read; grey: not reported yet)"
    return alt.LayerChart(layer=[unknown, known], title=title).properties(width=step, height=step)


def rank_bars(progress: dict[str, Any]) -> alt.Chart:
    """Epoch share read by each rank: they should move together; a short bar lags."""
    frame = pd.DataFrame(progress["ranks"])
    return (
        alt.Chart(frame, title="epoch read per rank")
        .mark_bar()
        .encode(
            x=alt.X("pct:Q", scale=alt.Scale(domain=[0, 100]), title="% of the rank's rows"),
            y=alt.Y("rank:O"),
            color=alt.Color("rank:N", scale=alt.Scale(scheme="tableau20"), legend=None),
            tooltip=["rank:N", "step:Q", "rows_done:Q", "rows_total:Q"],
        )
        .properties(height=alt.Step(22))
    )


def series_chart(samples: list[dict[str, Any]], field: str, title: str) -> alt.Chart:
    """One line per rank over time (`field` = rows_per_s, wait_per_step_s or stall_frac)."""
    frame = pd.DataFrame(samples or [{"rank": 0, "t": 0.0, field: 0.0}])
    frame["time"] = pd.to_datetime(frame["t"], unit="s")
    return (
        alt.Chart(frame, title=title)
        .mark_line(point=len(frame) < 200)
        .encode(
            x=alt.X("time:T", title=None),
            y=alt.Y(f"{field}:Q", title=title),
            color=alt.Color("rank:N", scale=alt.Scale(scheme="tableau20")),
            tooltip=["rank:N", "time:T", alt.Tooltip(f"{field}:Q", format=",.3f")],
        )
        .properties(height=260)
    )


def timeline_chart(items: list[dict[str, Any]]) -> alt.LayerChart:
    """Checkpoints and resumes on a time axis, each labelled ('resumed: W 8 → 4 at step …')."""
    frame = pd.DataFrame(items)
    frame["time"] = pd.to_datetime(frame["ts"], unit="s")
    base = alt.Chart(frame).encode(
        x=alt.X("time:T", title=None),
        y=alt.Y("kind:N", title=None),
        color=alt.Color("kind:N", legend=None),
        tooltip=["label:N", "time:T", "ranks:Q"],
    )
    labels = base.mark_text(dy=-14).encode(text="label:N")
    points = base.mark_point(size=120, filled=True)
    return alt.LayerChart(layer=[points, labels]).properties(height=80 * frame["kind"].nunique())
