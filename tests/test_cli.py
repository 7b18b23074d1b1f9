"""What a new user meets first at the command line (issue 24 item 16): output piped into
`head` ends quietly, `--version` answers, and `plan` and `--num-splits` say what they are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loader import __version__
from loader.tools.cli import main

PLAN_ROWS = ["rows", "plan", "--step", "0", "--rows", "400000", "--num-splits", "8"]
PLAN_ROWS += ["--world-size", "2", "--global-batch", "200000"]  # 200,000 lines: > a pipe's buffer


def test_rows_into_head_ends_quietly() -> None:
    """`elastic-loader rows ... | head` ended in a BrokenPipeError traceback, exit 1."""
    command = [sys.executable, "-m", "loader.tools.cli", *PLAN_ROWS]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        head = [proc.stdout.readline() for _ in range(3)]
        proc.stdout.close()  # as `head` does after its lines
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=300)
    assert head[0].startswith(b"# global step 0") and len(head[2].split(b"\t")) == 2
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 0


def test_version_and_what_plan_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"elastic-loader {__version__}"
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "What a layout supports, without opening a table" in text
    assert "the number of disjoint streams the epoch is cut into" in text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "what a (rows, num_splits) layout supports" in capsys.readouterr().out
