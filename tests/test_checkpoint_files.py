"""What a checkpoint file may be: a regular file under the size limit, never a FIFO or a
device (`loader/checkpoint_io.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loader import checkpoint, checkpoint_io
from loader.checkpoint import CheckpointError, load, save
from tests.test_checkpoint import assert_refused, make_state

_LOAD_IN_CHILD = """
import sys
from loader.checkpoint import CheckpointError, load
try:
    load(sys.argv[1])
except CheckpointError as exc:
    print(exc)
"""


@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero"])
@pytest.mark.slow
def test_only_regular_files_are_read(tmp_path: Path, kind: str) -> None:
    """A FIFO blocked load forever; a link to /dev/zero filled memory. Run in a child under
    a timeout so that a regression fails instead of hanging the suite."""
    path = tmp_path / "ckpt.json"
    if kind == "fifo":
        os.mkfifo(path)
        expected = "is a named pipe (FIFO), not a regular file"
    else:
        path.symlink_to("/dev/zero")
        expected = "is a character device (a link to /dev/zero), not a regular file"
    for command in (
        [sys.executable, "-c", _LOAD_IN_CHILD, str(path)],
        [sys.executable, "-m", "loader.tools.cli", "inspect", str(path)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert f"checkpoint {path}: {expected}" in done.stdout + done.stderr
    assert done.returncode == 2  # inspect


def test_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(checkpoint.MAX_FILE_BYTES + 1)  # sparse: nothing is written
    assert_refused(huge, None, "67,108,865 bytes, over the 67,108,864-byte limit")
    # save refuses what load would refuse; checked with a small limit to stay cheap
    monkeypatch.setattr(checkpoint_io, "MAX_FILE_BYTES", 2_000)
    save(make_state(), tmp_path / "small.json")
    with pytest.raises(CheckpointError, match="over the 2,000-byte limit"):
        save(make_state(num_splits=1000), tmp_path / "big.json")
    assert not (tmp_path / "big.json").exists()


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope.json")):
        load(tmp_path / "nope.json")
    assert_refused(tmp_path, None, "latest(folder)")
