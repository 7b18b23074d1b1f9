"""One colour per state and per timeline kind, whichever a run has (issue 25 points 3-4):
an epoch end is never drawn in the crash's colour, and crashed is never a green."""

from __future__ import annotations

import colorsys
from typing import Any

from dashboard import charts


def _hue(colour: str) -> float:
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hsv(r, g, b)[0] * 360


def _item(kind: str, ts: float, step: int) -> dict[str, Any]:
    return {"kind": kind, "ts": ts, "end_ts": None, "step": step, "label": kind, "ranks": 1}


def _point_colours(items: list[dict[str, Any]]) -> dict[str, str]:
    spec = charts.timeline_chart(items).to_dict()
    [points] = [layer for layer in spec["layer"] if "color" in layer.get("encoding", {})]
    scale = points["encoding"]["color"]["scale"]
    return dict(zip(scale["domain"], scale["range"], strict=True))


def test_a_kind_keeps_its_colour_whichever_kinds_a_run_has() -> None:
    only_routine = _point_colours([_item("epoch_end", 1e9, 10)])
    with_crash = _point_colours([_item("crash", 1e9 + 5, 12), _item("epoch_end", 1e9, 10)])
    assert only_routine == with_crash == charts.KIND_COLOURS
    assert only_routine["epoch end"] != only_routine["crash"]


def test_crashed_is_never_green_and_states_are_distinct() -> None:
    crashed = _hue(charts.STATE_COLOURS["crashed"])
    assert not 75 <= crashed <= 170, crashed  # vermillion, not a green
    assert len(set(charts.STATE_COLOURS.values())) == len(charts.STATE_COLOURS)


def _rank_scale(layout: dict[str, Any], ranks: int | None) -> Any:
    spec = charts.placement_grid(layout, 8, "t", ranks).to_dict()
    colours = [
        layer["encoding"]["color"] for layer in spec["layer"] if "color" in layer["encoding"]
    ]
    return colours[0]["scale"]["domain"]


def test_a_rank_keeps_its_colour_across_a_resize() -> None:
    """4 -> 3: the before and after grids share one scale, so rank 2 is one colour."""

    def layout(world: int) -> dict[str, Any]:
        owner = [s * world // 8 for s in range(8)]
        ranks = [
            {"rank": r, "state": "running", "splits": [owner.index(r), 8 - owner[::-1].index(r)],
             "host": "h", "gpu": r, "num_workers": 0}
            for r in range(world)
        ]  # fmt: skip
        return {"world_size": world, "owner": owner, "shared": [], "ranks": ranks}

    assert _rank_scale(layout(4), 4) == _rank_scale(layout(3), 4) == [0, 3]


def test_the_rank_heatmap_outlines_each_silent_state_in_its_colour_and_fits_its_column() -> None:
    """1,024 ranks: a stalled rank outlined orange (not crashed's vermillion), the legends
    below the cells and the cells within the side column (a legend beside them was cut off
    at 1,400 px)."""
    ranks = [{"rank": r, "pct": 10.0, "state": "running", "global_step": 5} for r in range(1024)]
    ranks[3]["state"], ranks[9]["state"] = "stalled", "crashed"
    spec = charts.rank_heatmap(ranks).to_dict()
    stroke = spec["encoding"]["stroke"]["condition"]
    colours = dict(zip(stroke["scale"]["domain"], stroke["scale"]["range"], strict=True))
    assert colours["stalled"] == charts.STATE_COLOURS["stalled"] != colours["crashed"]
    assert colours["crashed"] == charts.STATE_COLOURS["crashed"]
    assert stroke["legend"]["values"] == ["stalled", "crashed"]
    assert spec["encoding"]["color"]["legend"]["orient"] == "bottom"
    assert stroke["legend"]["orient"] == "bottom"
    cols = 64  # 1,024 ranks: 64 columns of 16 rows
    assert cols * spec["width"]["step"] <= charts.HEATMAP_PX
