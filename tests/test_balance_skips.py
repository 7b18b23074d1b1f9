"""Rows skipped for balance reach the dashboard (issue 33 item 13's leftover).

On W ranks a step's last rows that cannot give every rank one are skipped for the epoch and
counted in the state (`skipped`). The ranks' progress events now carry that count, and the
progress view says "N rows skipped for balance", only when N is not zero. One real run per
world size over the same 202 rows (S=2, G=4: 50 full steps and 2 rows left): on W=3 those 2
rows cannot be balanced, on W=2 they can.
"""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.launch import DashboardHandle
from dashboard.screens.progress import bars_html
from loader import StreamingDataLoader, StreamingDataset
from tests.net import get_json, wait_until
from tests.tables import make_rows

pytestmark = pytest.mark.slow  # starts the collector

ROWS = 202


def _run(collector: DashboardHandle, world: int, run_id: str) -> tuple[int, int]:
    """A whole epoch on `world` ranks reporting to the collector: (rows read, state's skipped)."""
    table = make_rows(0, ROWS)
    loaders = [
        StreamingDataLoader(
            StreamingDataset(table, num_splits=2, shuffle_seed=3, rank=r, world_size=world),
            global_batch_size=4,
            telemetry=collector.api_url,
            run_id=run_id,
        )
        for r in range(world)
    ]
    skipped = loaders[0].state_dict()["skipped"]
    read = [i for dl in loaders for batch in dl for i in batch["id"].tolist()]
    for dl in loaders:
        dl.close()
    assert len(read) == len(set(read)), "no row twice"
    return len(read), skipped


def _progress(collector: DashboardHandle, run_id: str, world: int) -> dict[str, Any]:
    """The progress view once every rank's last report is in."""
    url = f"{collector.api_url}/api/runs/{run_id}/progress"

    def done() -> dict[str, Any] | None:
        progress = get_json(url, otherwise=None)
        ranks = (progress or {}).get("ranks", [])
        return progress if len(ranks) == world and progress["state"] == "finished" else None

    return wait_until(done, 60, f"{run_id}'s last reports")


@pytest.mark.usefixtures("patient_telemetry")
def test_the_progress_view_says_how_many_rows_were_skipped_for_balance(
    collector: DashboardHandle,
) -> None:
    read, skipped = _run(collector, 3, "balance-w3")
    assert skipped > 0 and read + skipped == ROWS  # the state's count is the true one
    progress = _progress(collector, "balance-w3", 3)
    assert progress["skipped"] == skipped
    assert f"{skipped:,} rows skipped for balance" in bars_html(progress, per_rank=False)

    read, skipped = _run(collector, 2, "balance-w2")
    assert (read, skipped) == (ROWS, 0)
    progress = _progress(collector, "balance-w2", 2)
    assert progress["skipped"] == 0
    assert "skipped" not in bars_html(progress, per_rank=True)
