"""examples/pretrain_lm.py and pretrain_mixture.py, shortened: real processes (Gloo), a SIGKILL
on W = 4 and a resume on W = 2 give the uninterrupted run's loss at every step, and every
packed block once per epoch (for the mixture: the same blocks every step, at its weights)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.docs_blocks import output_matches, shown_output

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-9  # float64; the W = 4 and W = 2 sums differ only in order (~1e-15)


def run_quick(example: str, out: Path) -> dict[str, Any]:
    """Run `examples/<example> --quick --out <out>`; its summary."""
    cmd = [sys.executable, str(REPO / "examples" / example), "--quick", "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_crash_on_4_resume_on_2_gives_the_same_loss_curve(tmp_path: Path) -> None:
    summary = run_quick("pretrain_lm.py", tmp_path)
    crash = summary["crash"]
    assert 0 < crash["checkpoint_step"] < crash["after_step"] < summary["steps"]
    assert summary["max_abs_loss_difference"] <= TOLERANCE
    assert summary["every_block_once_per_epoch"] is True
    assert summary["last_loss"] < summary["first_losses"][0]  # it does learn
    blocks = summary["steps"] * summary["global_batch"] // 2  # two epochs
    assert summary["blocks_per_epoch"] == {"0": blocks, "1": blocks}
    # docs/packing.md prints this run's output: it must be what the run prints now
    [shown] = shown_output("python examples/pretrain_lm.py --quick --out /tmp/pretrain")
    assert output_matches(shown, json.dumps(summary, indent=2)) is None


def test_annealed_mixture_crash_on_4_resume_on_2_gives_the_same_curve(tmp_path: Path) -> None:
    summary = run_quick("pretrain_mixture.py", tmp_path)
    crash = summary["crash"]
    assert summary["anneal_at_step"] < crash["checkpoint_step"] < crash["after_step"]
    assert crash["after_step"] < summary["steps"]
    assert summary["max_abs_loss_difference"] <= TOLERANCE
    assert summary["same_blocks_every_step"] is True
    assert summary["last_loss"] < summary["first_loss"]  # it does learn
    g, anneal, steps = summary["global_batch"], summary["anneal_at_step"], summary["steps"]
    before, after = summary["weights"]["before"], summary["weights"]["after"]
    for name, blocks in summary["blocks_per_corpus"].items():  # exact shares, both phases
        want = anneal * g * before[name] / sum(before.values())
        want += (steps - anneal) * g * after[name] / sum(after.values())
        assert blocks == want
