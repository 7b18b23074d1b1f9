"""The per-node placement table and the ranks table's search (issue 25 point 4): at 64-1,024
processes the page says which node holds which ranks and splits, how far they read, and who
is crashed, stalled or behind, in that state's colour."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from dashboard import charts
from dashboard.nodes import (
    behind,
    find,
    groups,
    mark,
    marked_cells,
    node_table,
    rank_spans,
    sort_ranks,
    sortable,
)
from dashboard.palette import STATE_COLOURS
from dashboard.placement import layout_of

PER_SPLIT = 100


def _rank(rank: int, read: int, state: str = "running") -> dict[str, Any]:
    """Rank `rank` on node `rank // 8`, two splits of PER_SPLIT rows, `read` of them read."""
    return {
        "rank": rank,
        "host": f"node{rank // 8}",
        "state": state,
        "splits": [2 * rank, 2 * rank + 2],
        "cursors": [read // 2, read - read // 2],
    }


def test_one_row_per_node_and_the_ranks_behind_named_first() -> None:
    ranks = [_rank(r, 100) for r in range(24)]
    ranks[17] = _rank(17, 90)  # 45.0 % against a median of 50.0 %
    ranks[3] = _rank(3, 100, "crashed")
    ranks[20] = _rank(20, 99)  # 49.5 %: within a point of the median, not behind
    table = node_table(ranks, PER_SPLIT)
    assert list(table.index) == ["node0", "node2", "node1"]  # crashed first, then behind
    assert table.index.name == "node"
    assert table.loc["node0"].tolist() == [
        "0–7", "0–15", "1 crashed · 7 running", "50.0% / 50.0% / 50.0%",
        "rank 3 (50.0%)", "—", "—", "—",
    ]  # fmt: skip
    assert table.loc["node2"].tolist() == [
        "16–23", "32–47", "8 running", "45.0% / 50.0% / 50.0%", "—", "—", "—", "rank 17 (45.0%)"
    ]  # fmt: skip
    assert table.loc["node1", "behind"] == "—"


def test_1024_ranks_on_one_host_read_as_ranges_of_32_with_each_mark_in_its_colour() -> None:
    """No host groups them: fixed ranges of 32 ranks, the worst first (crashed, stalled,
    terminated, behind), each range's splits and min / median / max read."""
    ranks = [_rank(r, 100) | {"host": "box"} for r in range(1024)]
    ranks[700] |= {"state": "stalled"}
    ranks[40] |= {"state": "crashed"}
    ranks[999] |= {"state": "terminated"}
    ranks[5] = _rank(5, 20) | {"host": "box"}  # 10.0 %: behind
    ranks[6] = _rank(6, 60) | {"host": "box"}  # 30.0 %: behind
    found = groups(ranks, PER_SPLIT)
    assert len(found) == 32 and all(len(g.ranks) == 32 for g in found)
    table = node_table(ranks, PER_SPLIT)
    assert table.index.name == "rank range"
    assert list(table.index[:5]) == [
        "ranks 32–63", "ranks 672–703", "ranks 992–1,023", "ranks 0–31", "ranks 64–95",
    ]  # fmt: skip
    first = table.loc["ranks 0–31"]
    assert first["splits"] == "0–63"
    assert first["read min / median / max"] == "10.0% / 50.0% / 50.0%"
    assert first["behind"] == "rank 5 (10.0%), rank 6 (30.0%)"
    assert table.loc["ranks 32–63", "crashed"] == "rank 40 (50.0%)"
    assert table.loc["ranks 672–703", "stalled"] == "rank 700 (50.0%)"
    assert table.loc["ranks 992–1,023", "terminated"] == "rank 999 (50.0%)"
    styles = marked_cells(table).to_html()
    for state in ("crashed", "stalled", "terminated", "behind"):
        assert f"background-color: {STATE_COLOURS[state]}" in styles
    assert "background-color: #009e73" not in styles  # nothing marked in running's green


def test_one_node_drawn_row_per_rank_in_its_state_colour() -> None:
    """The drill-down grid: node 0's ranks, each row its splits; the crashed rank's cells in
    crashed's vermillion, the one behind in behind's yellow, never green."""
    ranks = [_rank(r, 100) for r in range(128)]
    ranks[3] = _rank(3, 100, "crashed")
    ranks[5] = _rank(5, 10)
    layout = layout_of(128, 256) | {"ranks": ranks, "world_size": 128}
    late = behind(ranks, PER_SPLIT)
    marks = {r["rank"]: mark(r, late) for r in ranks[:8]}
    spec = charts.group_grid(layout, list(range(8)), marks, "node0").to_dict()
    values = next(iter(spec["datasets"].values()))
    cells = {(v["rank"], v["split"]): v["state"] for v in values}
    assert set(cells) == {(r, s) for r in range(8) for s in (2 * r, 2 * r + 1)}
    assert cells[(3, 6)] == "crashed" and cells[(5, 10)] == "behind" and cells[(0, 0)] == "running"
    scale = spec["layer"][0]["encoding"]["color"]["scale"]
    colour = dict(zip(scale["domain"], scale["range"], strict=True))
    assert colour["crashed"] == "#d55e00" and colour["behind"] == STATE_COLOURS["behind"]
    assert spec["layer"][0]["encoding"]["color"]["legend"]["values"] == [
        "running", "crashed", "behind",
    ]  # fmt: skip


def test_the_sortable_ranks_table_sorts_numbers_as_numbers() -> None:
    frame = pd.DataFrame(
        {"state": ["running", "crashed"], "read": ["9.5%", "—"], "global step": ["1,250", "9"]},
        index=pd.Index(["rank 100", "rank 17"], name="rank"),
    )
    out = sortable(frame)
    assert list(out.columns) == ["rank", "state", "read %", "global step"]
    assert out["rank"].tolist() == [100, 17]
    assert out["global step"].tolist() == [1250, 9]
    assert out["read %"].iloc[0] == 9.5 and pd.isna(out["read %"].iloc[1])


def test_rank_spans_read_as_ranges() -> None:
    assert rank_spans([9, 0, 1, 2, 3, 5, 10, 11]) == "0–3, 5, 9–11"
    assert rank_spans([4]) == "4"


def test_find_a_rank_by_number_or_any_text() -> None:
    frame = pd.DataFrame(
        {"state": ["running", "crashed", "running"], "host": ["node0", "node2", "node21"]},
        index=["rank 1", "rank 17", "rank 170"],
    )
    assert list(find(frame, "17").index) == ["rank 17"]  # not rank 170
    assert list(find(frame, "CRASHED").index) == ["rank 17"]
    assert list(find(frame, "node2").index) == ["rank 17", "rank 170"]
    assert list(find(frame, "  ").index) == list(frame.index)


def test_the_ranks_table_sorts_as_picked() -> None:
    frame = pd.DataFrame(
        {"host": ["b", "a", "a"], "read": ["50.0%", "—", "20.0%"]},
        index=["rank 10", "rank 2", "rank 9"],  # worst first, as the page builds it
    )
    assert list(sort_ranks(frame, "worst first").index) == ["rank 10", "rank 2", "rank 9"]
    assert list(sort_ranks(frame, "rank").index) == ["rank 2", "rank 9", "rank 10"]  # numbers
    assert list(sort_ranks(frame, "host").index) == ["rank 2", "rank 9", "rank 10"]
    assert list(sort_ranks(frame, "read").index) == ["rank 9", "rank 10", "rank 2"]  # — last
    with pytest.raises(ValueError, match="pick one of worst first, rank, host, read"):
        sort_ranks(frame, "speed")
