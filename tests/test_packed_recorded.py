"""Packed batches and states equal main's (3b19824), recorded as digests of generated runs
(tests/packed_digests.py says how to record them): one table on W = 2, clumps of 1, no
shuffle, padding, the narrow batch, resumes on another W, mixtures, and DataLoader workers.
The hypothesis tests (test_packing, test_sample_index) check the rule; these check that a
faster read path hands out the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.packed_digests import cases

RECORDED = json.loads((Path(__file__).parent / "fixtures/packed-main-digests.json").read_text())
IN_PROCESS = cases(workers=False)


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_packed_runs_hand_out_mains_batches_and_states(name: str) -> None:
    assert IN_PROCESS[name]() == RECORDED[name]


@pytest.mark.slow
def test_packed_run_with_workers_hands_out_mains_batches_and_states() -> None:
    assert cases(workers=True)["workers_lance"]() == RECORDED["workers_lance"]
