"""examples/pretrain_mixture.py, shortened: three corpora, weights annealed mid-run, a SIGKILL
on W = 4 and a resume on W = 2 give the uninterrupted run's loss and blocks at every step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-9  # float64; the W = 4 and W = 2 sums differ only in order (~1e-15)


def test_annealed_mixture_crash_on_4_resume_on_2_gives_the_same_curve(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "examples" / "pretrain_mixture.py"),
        "--quick",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    crash = summary["crash"]
    assert (
        summary["anneal_at_step"]
        < crash["checkpoint_step"]
        < crash["after_step"]
        < summary["steps"]
    )
    assert summary["max_abs_loss_difference"] <= TOLERANCE
    assert summary["same_blocks_every_step"] is True
    assert summary["last_loss"] < summary["first_loss"]  # it does learn
    g, anneal, steps = summary["global_batch"], summary["anneal_at_step"], summary["steps"]
    before, after = summary["weights"]["before"], summary["weights"]["after"]
    for name, blocks in summary["blocks_per_corpus"].items():  # exact shares, both phases
        want = anneal * g * before[name] / sum(before.values())
        want += (steps - anneal) * g * after[name] / sum(after.values())
        assert blocks == want
