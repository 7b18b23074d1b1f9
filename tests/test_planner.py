"""`elastic-loader plan` answers what a layout supports, and agrees with the loader's errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loader.cli import main
from loader.plan import check_world_size
from loader.planner import plan_report


def test_plan_command_reports_splits_drops_world_sizes_and_batches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        [
            "plan",
            "--rows",
            "1000",
            "--num-splits",
            "48",
            "--world-sizes",
            "4,5,8",
            "--global-batch",
            "96",
        ]
    )
    out = capsys.readouterr().out
    assert status == 1, "an asked-for world size does not fit"
    assert "rows per split L = N // S = 20" in out
    assert "rows dropped per epoch: 40" in out
    assert "world sizes S supports: 1, 2, 3, 4, 6, 8, 12, 16, 24, 48" in out
    assert "identical global batches on every world size: yes; 10 global batches per epoch" in out
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()
    }
    assert rows["4"][1:4] == ["yes", "12", "24"]
    assert rows["5"][1] == "no"
    assert rows["8"][1:4] == ["yes", "6", "12"]


def test_report_matches_the_loaders_divisibility_check() -> None:
    report = plan_report(10_000, 24, world_sizes=list(range(1, 30)), global_batch=100)
    assert report.identical_global_batches is False
    for fit in report.fits:
        if fit.supported:
            check_world_size(24, fit.world_size)
        else:
            with pytest.raises(
                ValueError, match=r"supports world sizes \[1, 2, 3, 4, 6, 8, 12, 24\]"
            ):
                check_world_size(24, fit.world_size)


def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loader.cli", "plan", "--rows", "96", "--num-splits", "8"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "world sizes S supports: 1, 2, 4, 8" in out.stdout
