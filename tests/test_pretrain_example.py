"""examples/pretrain_lm.py, shortened: real processes (Gloo), a SIGKILL on W = 4 and a resume
on W = 2 give the uninterrupted run's loss at every step, and every packed block once per epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-9  # float64; the W = 4 and W = 2 sums differ only in order (~1e-15)


def test_crash_on_4_resume_on_2_gives_the_same_loss_curve(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "examples" / "pretrain_lm.py"),
        "--quick",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    crash = summary["crash"]
    assert 0 < crash["checkpoint_step"] < crash["after_step"] < summary["steps"]
    assert summary["max_abs_loss_difference"] <= TOLERANCE
    assert summary["every_block_once_per_epoch"] is True
    assert summary["last_loss"] < summary["first_losses"][0]  # it does learn
    blocks = summary["steps"] * summary["global_batch"] // 2  # two epochs
    assert summary["blocks_per_epoch"] == {"0": blocks, "1": blocks}
