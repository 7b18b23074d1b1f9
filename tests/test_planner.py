"""`elastic-loader plan` (and the dashboard's Planner) answer what a layout supports, agree
with the loader's errors, and stay quick and clear on absurd or bad input."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dashboard.placement import PLANNER_DEFAULTS, planner_defaults
from dashboard.synthetic import SyntheticRun
from loader.layout import check_world_size, supported_world_sizes
from loader.tools.cli import main
from loader.tools.planner import plan_report
from tests.collector_api import collector_client, post_runs, view


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
    assert status == 0, "G is a multiple of S: every W <= G fits"
    assert "rows per split L = N // S = 20" in out
    assert "rows dropped per epoch: 40" in out
    assert "world sizes S supports: 1, 2, 3, 4, 6, 8, 12, 16, 24, 48" in out
    assert "identical global batches on every world size: yes; 10 global batches per epoch" in out
    rows = {
        line.split()[0]: line.split() for line in out.splitlines() if line.strip()[:1].isdigit()
    }
    assert rows["4"][1:4] == ["yes", "12", "24"]
    assert rows["5"][1:4] == ["yes", "10", "19-20"]  # splits 9 and 19, 28, 38 are shared
    assert "r0:[0,9)+9[0:1 of 2] r1:9[1:2 of 2]+[10,19)" in out
    assert rows["8"][1:4] == ["yes", "6", "12"]
    assert "dl.loss_scale" in out
    args = "plan --rows 1000 --num-splits 48 --world-sizes 5 --global-batch 100"
    main(args.split(" "))
    assert "5  no" in capsys.readouterr().out  # G % S != 0: W must divide S


def test_report_matches_the_loaders_divisibility_check() -> None:
    assert plan_report(10_000, 24, global_batch=100).identical_global_batches is False
    report = plan_report(10_000, 24, world_sizes=list(range(1, 30)))  # no G: S decides alone
    for fit in report.fits:
        if fit.supported:
            check_world_size(24, fit.world_size)
        else:
            with pytest.raises(
                ValueError, match=r"supports world sizes \[1, 2, 3, 4, 6, 8, 12, 24\]"
            ):
                check_world_size(24, fit.world_size)
    report = plan_report(10_000, 24, world_sizes=list(range(1, 60)), global_batch=48)
    assert all(f.supported for f in report.fits[:48]) and not report.fits[48].supported
    for fit in report.fits[:48]:
        check_world_size(24, fit.world_size, 48)


@pytest.mark.slow
def test_console_script_is_installed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loader.tools.cli", "plan", "--rows", "96", "--num-splits", "8"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "world sizes S supports: 1, 2, 4, 8" in out.stdout


def test_counts_batches_and_dropped_rows() -> None:
    """(Moved from the dashboard's own planner, which now calls this one.)"""
    report = plan_report(1003, 8, [2, 3, 4], 40, drop_last=True)
    assert report.rows_dropped == 3  # 1003 - 8 * 125
    by_w = {f.world_size: f for f in report.fits}
    assert by_w[3].supported and (by_w[3].smallest_batch, by_w[3].batch_size) == (13, 14)
    assert (by_w[4].batch_size, by_w[4].batches_per_epoch) == (10, 25)  # 250 rows / 10
    assert report.identical_global_batches and by_w[2].batches_per_epoch == 25
    assert plan_report(1003, 8, [4], 48).fits[0].batches_per_epoch == 21  # ceil(1000 / 48)


def test_a_world_size_that_divides_s_but_not_g_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI said "yes" and the dashboard "no" for S % W == 0, G % W != 0: no whole batch
    per rank, so it does not fit (the loader's batch_size = G / W must be an integer)."""
    args = "plan --rows 4800 --num-splits 48 --world-sizes 8,6 --global-batch 100"
    status = main(args.split())
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[6:]}
    assert status == 1
    assert rows["8"].split()[1] == "no" and "G=100 is not a multiple of world_size=8" in rows["8"]
    assert rows["6"].split()[1:4] == ["no", "-", "-"]


_PAGE = """
import sys
from streamlit.testing.v1 import AppTest

page = AppTest.from_file(sys.argv[1], default_timeout=120)
page.run()
page.text_input[0].set_value("4 8 12").run()
page.number_input[1].set_value(48).run()  # S
page.number_input[2].set_value(100).run()  # G
assert not page.exception and not page.error, (page.exception, page.error)
table = page.table[0].value
print(dict(zip(table.index.astype(str), table["fits"])))
print(sorted({"torch", "numba"} & set(sys.modules)))
"""


@pytest.mark.slow
def test_the_dashboard_planner_page_shows_the_same_answer_without_torch() -> None:
    page = Path(__file__).parents[1] / "dashboard" / "screens" / "planner.py"
    done = subprocess.run(
        [sys.executable, "-c", _PAGE, str(page)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    fits, heavy = done.stdout.strip().splitlines()[-2:]
    assert fits == "{'4': 'yes', '8': 'no', '12': 'no'}"
    assert heavy == "[]"
    cli = plan_report(1_000_000, 48, [4, 8, 12], 100)
    assert [f.supported for f in cli.fits] == [True, False, False]


def _plan(args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child with a deadline: absurd sizes used to loop for minutes."""
    command = [sys.executable, "-m", "loader.tools.cli", "plan", *args.split()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_absurd_sizes_answer_at_once() -> None:
    done = _plan("--rows 2000000000000 --num-splits 1000000000000")  # ran > 30 s before
    assert done.returncode == 0, done.stderr
    assert _plan("--rows 2e12 --num-splits 1e12").stdout == done.stdout
    assert "rows per split L = N // S = 2;" in done.stdout
    assert "world sizes S supports: 1, 2, 4, 5, 8, 10," in done.stdout  # 169 divisors
    assert "… and 105 more world sizes (ask with --world-sizes)" in done.stdout
    done = _plan("--rows 2e12 --num-splits 1e12 --world-sizes 1e12,3 --global-batch 2e12")
    assert done.returncode == 0, done.stderr  # G is a multiple of S: W = 3 fits too
    assert "r0:[0,1) r1:[1,2)" in done.stdout and "(999,999,999,992 more)" in done.stdout
    assert "r1:[333333333333,666666666666)+666666666666[0:1 of 2]" in done.stdout
    done = _plan("--rows 9e18 --num-splits 4e18")
    assert done.returncode == 2
    assert "num_splits must be an integer in [1, 1,099,511,627,776], got" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rows", "0", "--num-splits", "8"], "argument --rows: '0' is below 1"),
        (["--rows", "10", "--num-splits", "0"], "argument --num-splits: '0' is below 1"),
        (["--rows", "10", "--num-splits", "2", "--global-batch", "-4"], "'-4' is below 1"),
        (["--rows", "10", "--num-splits", "2", "--global-batch", "0"], "'0' is below 1"),
        (["--rows", "2.5", "--num-splits", "2"], "'2.5' is not a whole number"),
        (["--rows", "ten", "--num-splits", "2"], "'ten' is not a number"),
        (["--rows", "10", "--num-splits", "2", "--world-sizes", "2,0"], "'0' is below 1"),
        (["--rows", "10", "--num-splits", "2", "--num-workers", "-1"], "'-1' is below 0"),
    ],
)
def test_bad_numbers_are_refused_naming_the_argument(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_more_splits_than_rows_is_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--rows", "10", "--num-splits", "20"]) == 2
    err = capsys.readouterr().err
    assert "num_splits must be an integer in [1, 10] (every split needs a row), got 20" in err
    assert main(["plan", "--rows", "1_000", "--num-splits", "1e1"]) == 0  # written either way


@given(st.integers(1, 5000))
def test_world_sizes_are_the_divisors(num_splits: int) -> None:
    expected = [w for w in range(1, num_splits + 1) if num_splits % w == 0]
    assert supported_world_sizes(num_splits) == expected


def test_the_planner_starts_from_the_selected_run(tmp_path: Path) -> None:
    """Issue 25 point 6: its N, S, G and world size, and drop_last unticked (the loader's
    default), instead of fixed numbers that ignore the run."""
    run = SyntheticRun("job", 3, 12, 5_000, 5, time.time() - 5, global_batch_size=240)
    with collector_client(tmp_path / "p.db") as client:
        post_runs(client, run)
        start = planner_defaults(view(client, "job", "placement"))
    assert (start["rows"], start["num_splits"], start["global_batch"]) == (60_000, 12, 240)
    assert "3" in start["gpus"].replace(",", " ").split()
    assert start["drop_last"] is False
    assert planner_defaults(None) == PLANNER_DEFAULTS and PLANNER_DEFAULTS["drop_last"] is False
