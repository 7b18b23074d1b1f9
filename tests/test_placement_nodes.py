"""The per-node placement table and the ranks table's search (issue 25 point 4): at 64-1,024
processes the page says which node holds which ranks and who is behind."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from dashboard.nodes import find, node_table, rank_spans, sort_ranks

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
    assert list(table.index) == ["node0", "node2", "node1"]  # nodes with a rank behind first
    assert table.loc["node0"].tolist() == ["0–7", "1 crashed · 7 running", "50.0–50.0%", "rank 3"]
    assert table.loc["node2"].tolist() == ["16–23", "8 running", "45.0–50.0%", "rank 17"]
    assert table.loc["node1", "behind"] == "—"


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
