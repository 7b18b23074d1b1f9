"""Altair charts built from the collector's JSON: pure functions, no Streamlit, testable.

Splits are drawn as a grid of at most `GRID_COLS` columns so that S = 8 and S = 4,096 both
read at a glance; the same geometry serves placement (colour = owning rank) and progress
(colour = cursor / rows per split), so the two pages line up cell for cell. Ranks are
coloured on a continuous scale (turbo), which never repeats a colour: rank 0 and rank 20
differ at 64 ranks as at 1,024. Times are UTC on a 24-hour clock, as in the tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from dashboard.palette import KIND_COLOURS, STATE_COLOURS

GRID_COLS = 64
LABELS_FROM_PX = 18
TIME_FORMAT = "%H:%M:%S"
SILENT = ("stalled", "crashed", "terminated")


def _cols(num_cells: int) -> int:
    return max(1, min(GRID_COLS, math.ceil(math.sqrt(num_cells * 4))))


def cell_px(num_cells: int) -> int:
    """Cells as large as fit ~400 px across (half a wide page), 6-40 px."""
    return max(6, min(40, 400 // _cols(num_cells)))


def _time_x(field: str = "time") -> alt.X:
    return alt.X(
        f"{field}:T",
        title="time (UTC)",
        scale=alt.Scale(type="utc"),
        axis=alt.Axis(format=TIME_FORMAT),
    )


def _ms(seconds: Any) -> Any:
    """Epoch seconds as epoch milliseconds: Vega reads numbers on a time axis as UTC instants."""
    return seconds * 1000.0


def split_frame(owner: list[int], cursors: list[int | None] | None = None) -> pd.DataFrame:
    """One row per split: its grid position, owning rank and (if known) cursor."""
    cols = _cols(len(owner))
    split = np.arange(len(owner))
    frame = pd.DataFrame({"split": split, "rank": owner, "col": split % cols, "row": split // cols})
    if cell_px(len(owner)) >= LABELS_FROM_PX:
        frame["label"] = [f"r{r}" for r in owner]
    if cursors is not None:
        frame["cursor"] = np.array([-1 if c is None else c for c in cursors], dtype=np.int64)
    return frame


def piece_frame(layout: dict[str, Any]) -> pd.DataFrame:
    """The placement grid's cells: one per split, except that a split several ranks share
    is cut across into one cell per rank, as wide as the rank's part of it (`shared`)."""
    owner = layout["owner"]
    cols, per = _cols(len(owner)), layout.get("rows_per_step") or 1
    split = np.arange(len(owner))
    frame = pd.DataFrame({"split": split, "rank": owner, "x": split % cols, "row": split // cols})
    frame["x2"], frame["part"] = frame["x"] + 1, "whole"
    shared = layout.get("shared") or []
    if shared:
        parts = [(s["split"], p) for s in shared for p in s["parts"]]
        cut = pd.DataFrame(
            {
                "split": [s for s, _ in parts],
                "rank": [p["rank"] for _, p in parts],
                "x": [s % cols + p["start"] / per for s, p in parts],
                "row": [s // cols for s, _ in parts],
                "x2": [s % cols + p["stop"] / per for s, p in parts],
                "part": [f"rows {p['start']}–{p['stop'] - 1} of {per} a step" for _, p in parts],
            }
        )
        whole = ~frame["split"].isin([s["split"] for s in shared])
        frame = pd.concat([frame[whole], cut], ignore_index=True)
    frame["row2"] = frame["row"] + 1
    frame["label_x"] = (frame["x"] + frame["x2"]) / 2
    return frame


def placement_grid(
    layout: dict[str, Any], num_splits: int, title: str, colour_ranks: int | None = None
) -> alt.LayerChart:
    """Splits coloured by the rank that reads them (continuous, never repeating); a split
    two ranks share is cut into their parts; splits of a rank that went silent (stalled or
    crashed) are dark. Tooltips: the part read, host, GPU, workers, state. `colour_ranks`:
    the largest world of the run (before and after a resize), so rank r has one colour."""
    frame = piece_frame(layout)
    by_rank = {r["rank"]: r for r in layout["ranks"]}
    frame["host"] = [by_rank.get(r, {}).get("host", "?") for r in frame["rank"]]
    frame["GPU"] = [by_rank.get(r, {}).get("gpu", "-") for r in frame["rank"]]
    frame["workers"] = [by_rank.get(r, {}).get("num_workers", 0) for r in frame["rank"]]
    frame["state"] = [by_rank.get(r, {}).get("state", "not reported") for r in frame["rank"]]
    frame["silent"] = frame["state"].isin(SILENT)
    cell = cell_px(num_splits)
    cols, rows = _cols(num_splits), -(-num_splits // _cols(num_splits))
    cols = min(cols, num_splits)
    if cell >= LABELS_FROM_PX:
        frame["label"] = [f"r{r}" for r in frame["rank"]]
    # one colour per rank on every grid of a run: before and after a resize share the scale
    world = max(1, (colour_ranks or layout["world_size"]) - 1)
    x_scale = alt.Scale(domain=[0, cols], nice=False, zero=False)
    y_scale = alt.Scale(domain=[0, rows], nice=False, reverse=True)
    x, y = alt.X("x:Q", scale=x_scale, axis=None), alt.Y("row:Q", scale=y_scale, axis=None)
    base = alt.Chart(frame).encode(x=x, x2="x2:Q", y=y, y2="row2:Q")
    tooltip = ["split:Q", "rank:Q", "part:N", "host:N", "GPU:N", "workers:Q", "state:N"]
    colour = alt.Color(
        "rank:Q",
        # turbo without its near-black ends: dark means "silent" on this grid
        scale=alt.Scale(scheme={"name": "turbo", "extent": [0.08, 0.92]}, domain=[0, world]),
        legend=alt.Legend(
            orient="bottom", title="rank", gradientLength=300, format="d", tickMinStep=1
        ),
    )
    # grey: who reads the split is not known yet (W does not divide S and no rank said G)
    unknown = alt.condition("datum.rank < 0", alt.value("#dddddd"), colour)
    cells = base.mark_rect(**_stroke(cell)).encode(color=unknown, tooltip=tooltip)
    dead = (
        base.transform_filter("datum.silent")
        .mark_rect(color="#212121", opacity=0.85)
        .encode(tooltip=tooltip)
    )
    layers: list[Any] = [cells, dead]
    if cell >= LABELS_FROM_PX:  # labels only where they are legible
        text = alt.Chart(frame).mark_text(fontSize=9, color="white")
        centre = alt.Y("mid:Q", scale=y_scale, axis=None)
        layers.append(
            text.transform_calculate(mid="datum.row + 0.5").encode(
                x=alt.X("label_x:Q", scale=x_scale, axis=None), y=centre, text="label:N"
            )
        )
    # Plot area of cols x rows cells; "pad": legend and title go around it (Streamlit's
    # default "fit" would squeeze them into these pixels and the grid to a strip).
    size = {"width": cols * cell, "height": rows * cell, "autosize": {"type": "pad"}}
    return alt.LayerChart(layer=layers, title=title).properties(**size)


def group_grid(
    layout: dict[str, Any], members: list[int], marks: dict[int, str | None], title: str
) -> alt.LayerChart:
    """One node's (or rank range's) placement, readable at any world size: one row per rank,
    its splits (and parts of shared ones) along a split axis, coloured by the rank's state or
    mark (`marks[r]`: crashed, stalled, terminated, behind; else its state), one colour per
    state on every page. Tooltips: the part read, host, state, share read."""
    frame = piece_frame(layout)
    cols = _cols(len(layout["owner"]))
    frame = frame[frame["rank"].isin(members)].copy()
    frame["x"] += frame["row"] * cols  # back from the wrapped grid to the split number
    frame["x2"] += frame["row"] * cols
    by_rank = {r["rank"]: r for r in layout["ranks"]}
    frame["host"] = [by_rank.get(r, {}).get("host", "?") for r in frame["rank"]]
    frame["state"] = [marks.get(r) or by_rank.get(r, {}).get("state", "?") for r in frame["rank"]]
    lo, hi = (int(frame["x"].min()), int(np.ceil(frame["x2"].max()))) if len(frame) else (0, 1)
    cell = max(1, min(40, 760 // max(1, hi - lo)))  # the page beside the sidebar, at 1,400 px
    x_scale = alt.Scale(domain=[lo, hi], nice=False, zero=False)
    x = alt.X(
        "x:Q",
        scale=x_scale,
        axis=alt.Axis(title="split", format="d", tickMinStep=1, labelFlush=True),
    )
    y = alt.Y("rank:O", axis=alt.Axis(title=None, labelExpr="'rank ' + datum.value"))
    present = [s for s in STATE_COLOURS if s in set(frame["state"])]
    colour = alt.Color(
        "state:N",
        scale=alt.Scale(domain=list(STATE_COLOURS), range=list(STATE_COLOURS.values())),
        legend=alt.Legend(orient="bottom", title="state", values=present, columns=4),
    )
    tooltip = ["split:Q", "rank:Q", "part:N", "host:N", "state:N"]
    base = alt.Chart(frame).encode(x=x, x2="x2:Q", y=y)
    rects = base.mark_rect(stroke="white", strokeWidth=1).encode(color=colour, tooltip=tooltip)
    layers: list[Any] = [rects]
    if cell >= 26:  # the split's number in its cell where it fits
        text = alt.Chart(frame).mark_text(fontSize=10, color="black")
        mid = alt.X("mid:Q", scale=x_scale, axis=None)
        layers.append(
            text.transform_calculate(mid="(datum.x + datum.x2) / 2").encode(
                x=mid, y=y, text="split:Q"
            )
        )
    size = {"width": cell * (hi - lo), "height": alt.Step(20 if len(members) <= 32 else 12)}
    return alt.LayerChart(layer=layers, title=title).properties(**size, autosize={"type": "pad"})


def _stroke(cell: int) -> dict[str, Any]:
    """White cell borders where cells are big enough to show them (they cost render time)."""
    return {"stroke": "white", "strokeWidth": 0.5} if cell >= 10 else {}


def progress_grid(progress: dict[str, Any]) -> alt.Chart:
    """Per-split cursor as a heatmap: 0 (white) to rows per split (dark); grey = unknown.
    One layer of S cells (a second layer for the unknown ones doubled the render time)."""
    frame = split_frame(progress["owner"], progress["cursors"])
    per_split = max(1, progress["rows_per_split"])
    frame["done"] = np.maximum(frame["cursor"], 0) / per_split
    cell = cell_px(len(frame))
    colour = alt.Color("done:Q", scale=alt.Scale(domain=[0, 1], scheme="blues"), title="read")
    title = "cursor per split (share of the split read; grey: not reported yet)"
    return (
        alt.Chart(frame, title=title)
        .mark_rect(**_stroke(cell))
        .encode(
            x=alt.X("col:O", axis=None),
            y=alt.Y("row:O", axis=None),
            color=alt.condition("datum.cursor < 0", alt.value("#dddddd"), colour),
            tooltip=["split:Q", "rank:N", "cursor:Q", alt.Tooltip("done:Q", format=".1%")],
        )
        .properties(width=alt.Step(cell), height=alt.Step(cell))
    )


HEATMAP_PX = 320  # the side column beside the split grid on a 1,400 px page


def rank_heatmap(ranks: list[dict[str, Any]]) -> alt.Chart:
    """Epoch share read by each rank, one cell per rank (for hundreds of ranks); a lagging
    rank is a pale cell, a silent one is outlined in its state's colour (stalled orange,
    crashed vermillion, terminated purple). At most `HEATMAP_PX` wide, the legend below it:
    at 1,024 ranks a legend at the side was cut off at 1,400 px."""
    cols = _cols(len(ranks))
    frame = pd.DataFrame(ranks or [{"rank": 0, "pct": 0.0, "state": "running"}])
    frame["col"] = frame["rank"] % cols
    frame["row"] = frame["rank"] // cols
    frame["share"] = frame["pct"] / 100
    cell = max(3, min(cell_px(len(frame)), HEATMAP_PX // cols))
    silent = [s for s in SILENT if s in set(frame["state"])]
    outline = alt.Stroke(
        "state:N",
        scale=alt.Scale(domain=list(SILENT), range=[STATE_COLOURS[s] for s in SILENT]),
        legend=alt.Legend(title="outline", values=silent, orient="bottom", direction="horizontal")
        if silent
        else None,
    )
    return (
        alt.Chart(frame, title="epoch read per rank (one cell per rank)")
        .mark_rect(strokeWidth=1.5)
        .encode(
            x=alt.X("col:O", axis=None),
            y=alt.Y("row:O", axis=None),
            color=alt.Color(
                "share:Q",
                scale=alt.Scale(domain=[0, 1], scheme="blues"),
                title="read",
                legend=alt.Legend(
                    gradientLength=min(200, cols * cell),
                    format=".0%",
                    orient="bottom",
                    direction="horizontal",
                ),
            ),
            stroke=alt.condition(
                alt.FieldOneOfPredicate("state", list(SILENT)), outline, alt.value(None)
            ),
            tooltip=["rank:Q", "state:N", alt.Tooltip("share:Q", format=".1%"), "global_step:Q"],
        )
        .properties(width=alt.Step(cell), height=alt.Step(cell))
    )


def rank_bars(ranks: list[dict[str, Any]]) -> alt.Chart:
    """Epoch share read by each rank (up to a few dozen ranks): they should move together."""
    frame = pd.DataFrame(ranks)
    colours = alt.Scale(domain=list(STATE_COLOURS), range=list(STATE_COLOURS.values()))
    return (
        alt.Chart(frame, title="epoch read per rank")
        .mark_bar()
        .encode(
            x=alt.X("pct:Q", scale=alt.Scale(domain=[0, 100]), title="% of the rank's rows"),
            y=alt.Y("rank:O"),
            color=alt.Color("state:N", scale=colours, title="state"),
            tooltip=["rank:N", "state:N", "global_step:Q", "rows_done:Q", "rows_total:Q"],
        )
        .properties(height=alt.Step(18))
    )


def band_chart(
    band: list[dict[str, Any]],
    title: str,
    crashed_at: float | None = None,
    crashed_before: Sequence[float] = (),
) -> alt.LayerChart:
    """Rows/s across ranks per time bucket: min-max band and median line; each `segment`
    is drawn apart, so an outage is a gap, not a straight line across it; a red rule where
    the run crashed, and where each crash that a resume followed happened."""
    frame = pd.DataFrame(band or [{"t": 0.0, "segment": 0, "median": 0.0, "min": 0.0, "max": 0.0}])
    frame["time"] = _ms(frame["t"])
    base = alt.Chart(frame).encode(x=_time_x(), detail="segment:N")
    area = base.mark_area(opacity=0.25, color="#1565c0").encode(
        y=alt.Y("min:Q", title=title), y2="max:Q"
    )
    tooltip = [
        alt.Tooltip("time:T", format=TIME_FORMAT, title="time (UTC)"),
        alt.Tooltip("median:Q", format=",.0f"),
        alt.Tooltip("min:Q", format=",.0f"),
        alt.Tooltip("max:Q", format=",.0f"),
    ]
    line = base.mark_line(color="#0d47a1", point=len(frame) < 60).encode(
        y="median:Q", tooltip=tooltip
    )
    layers: list[Any] = [area, line]
    crashes = [(t, "crash before a resume: last report") for t in crashed_before]
    crashes += [(crashed_at, "crash: last report")] if crashed_at is not None else []
    if crashes:
        crash = pd.DataFrame(
            {"time": [_ms(t) for t, _ in crashes], "what": [w for _, w in crashes]}
        )
        rule = alt.Chart(crash).mark_rule(
            color=STATE_COLOURS["crashed"], strokeWidth=2, strokeDash=[4, 3]
        )
        layers.append(rule.encode(x=_time_x(), tooltip=["what:N"]))
    chart_title = f"{title}: median across ranks, band from the slowest to the fastest"
    return alt.LayerChart(layer=layers, title=chart_title).properties(height=240)


def wait_chart(band: list[dict[str, Any]]) -> alt.Chart:
    """Share of step time spent waiting for data: median rank and the worst rank."""
    frame = pd.DataFrame(band or [{"t": 0.0, "segment": 0, "wait_median": 0.0, "wait_max": 0.0}])
    frame["time"] = _ms(frame["t"])
    long = frame.melt(
        id_vars=["time", "segment"], value_vars=["wait_median", "wait_max"], var_name="which"
    )
    long["which"] = long["which"].map({"wait_median": "median rank", "wait_max": "worst rank"})
    return (
        alt.Chart(long, title="share of step time waiting for data")
        .mark_line()
        .encode(
            x=_time_x(),
            y=alt.Y("value:Q", title="waiting for data", axis=alt.Axis(format="%")),
            color=alt.Color("which:N", title=None),
            detail="segment:N",
            tooltip=[
                alt.Tooltip("time:T", format=TIME_FORMAT, title="time (UTC)"),
                "which:N",
                alt.Tooltip("value:Q", format=".0%"),
            ],
        )
        .properties(height=200)
    )


def timeline_chart(items: list[dict[str, Any]], by_step: bool = False) -> alt.LayerChart:
    """Checkpoints, resumes, epoch ends, outages (shaded spans) and a crash on a time axis,
    or (`by_step`) on the global-step axis, where outages, which have no step, are left out.
    Labels are in the tooltip and the table below (on the chart they smear together)."""
    frame = pd.DataFrame(items)
    frame["time"] = _ms(frame["ts"])
    frame["end"] = _ms(frame["end_ts"].fillna(frame["ts"]))
    frame["what"] = frame["kind"].str.replace("_", " ")
    tooltip: list[Any] = [
        "label:N",
        alt.Tooltip("time:T", format=TIME_FORMAT, title="time (UTC)"),
        alt.Tooltip("step:Q", title="global step", format=","),
        "ranks:Q",
    ]
    x = alt.X("step:Q", title="global step", axis=alt.Axis(format=",d")) if by_step else _time_x()
    base = alt.Chart(frame).encode(x=x, tooltip=tooltip)
    points = base.transform_filter(
        "datum.kind != 'outage' && isValid(datum.step)" if by_step else "datum.kind != 'outage'"
    )
    kinds = alt.Scale(domain=list(KIND_COLOURS), range=list(KIND_COLOURS.values()))
    points = points.mark_point(size=140, filled=True).encode(
        y=alt.Y("what:N", title=None), color=alt.Color("what:N", scale=kinds, legend=None)
    )
    layers: list[Any] = [points]
    if not by_step:
        spans = base.transform_filter("datum.kind == 'outage'").mark_rect(
            color=KIND_COLOURS["outage"], opacity=0.15
        )
        layers.insert(0, spans.encode(x2="end:T"))
    return alt.LayerChart(layer=layers).properties(height=60 + 40 * frame["what"].nunique())
