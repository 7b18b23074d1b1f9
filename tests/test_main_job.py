"""The main job, shortened: parts 1 and 2 with real processes, in float64.

One driver process runs everything (its forkserver imports torch once for all ranks), on
a small synthetic table: 1,024 rows, 2 epochs of 4 global batches of 256. Part 1 trains
at W = 1, 2, 4; part 2 checkpoints every 3 steps at W = 4, SIGKILLs rank 1 after step 5
(mid-epoch 1, two steps after the checkpoint of step 3, itself mid-epoch 0) and resumes
on W = 3, which does not divide S = 8: with G = 256 the per-rank batches are 85, 85 and 86
rows (the loss weighted by `loss_scale`), and a second job at G = 240 has equal slices of
80. The test asserts what the README promises: the same weights to 1e-9 whatever W, and
every row used exactly once per epoch across the crash.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-9
ROWS = 1024


def run_main_job(root: Path, parts: str, global_batch: int) -> dict:
    out = root / "summary.json"
    cmd = [
        sys.executable, str(REPO / "examples" / "main_job.py"),
        "--parts", parts, "--worlds", "1,2,4", "--dtype", "float64", "--epochs", "2",
        "--db", str(root / "har.lancedb"), "--synthetic-rows", f"{ROWS},256",
        "--global-batch", str(global_batch),
        "--checkpoint-every", "3", "--crash-at-step", "5", "--crash-rank", "1",
        "--resume-world", "3", "--work-dir", str(root / "work"),
        "--no-dashboard", "--no-progress", "--summary-json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_main_job(tmp_path_factory.mktemp("main_job"), "1,2", 256)


def test_runs_at_every_world_size_end_with_the_same_weights(summary: dict) -> None:
    same = summary["same"]
    assert sorted(same["runs"], key=int) == ["1", "2", "4"]
    assert same["max_delta"] <= TOLERANCE
    for run in same["runs"].values():
        assert run["replica_spread"] <= TOLERANCE, run["world_size"]
        assert run["steps"] == 2 * ROWS // 256


def check_crash(summary: dict) -> None:
    crash = summary["crash"]
    assert "SIGKILL" in crash["failure"]
    assert crash["resumed_from_step"] == 3
    resumed = crash["resumed"]
    assert resumed["world_size"] == 3
    assert [e["epoch"] for e in resumed["rows_per_epoch"]] == [0, 1]
    for epoch in resumed["rows_per_epoch"]:
        assert epoch["rows"] == epoch["distinct"] == ROWS, epoch
        assert epoch["min"] == epoch["max"] == 1, epoch
    assert crash["exactly_once"]
    assert crash["max_delta"] <= TOLERANCE
    assert summary["problems"] == []


def test_crash_on_4_then_resume_on_3_unequal_slices_loses_and_repeats_nothing(
    summary: dict,
) -> None:
    check_crash(summary)  # G = 256 on 3 ranks: 85, 85, 86 rows a step


def test_crash_on_4_then_resume_on_3_equal_slices(tmp_path: Path) -> None:
    check_crash(run_main_job(tmp_path, "2", 240))  # G = 240 on 3 ranks: 80 rows each


def test_quickstart_resumes_on_another_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's quickstart runs as printed (in this process: no extra torch import)."""
    runpy.run_path(str(REPO / "examples" / "quickstart.py"), run_name="__main__")
    assert "every row exactly once" in capsys.readouterr().out


def test_job_report_prints_a_saved_runs_table(
    summary: dict,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`python examples/job_report.py FILE` prints the table again from --summary-json's file
    (#33 item 18: it printed nothing). In this process: it imports no torch."""
    saved = tmp_path / "main-job.json"
    saved.write_text(json.dumps(summary))
    monkeypatch.setattr(sys, "argv", ["job_report.py", str(saved)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / "examples" / "job_report.py"), run_name="__main__")
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert "Summary: 2 epochs, global batch 256, num_splits 8" in printed
    assert "1. Same training, split across ranks" in printed
    assert "2. Crash and resume elsewhere" in printed
    assert printed.rstrip().endswith("Result: every check passed")
