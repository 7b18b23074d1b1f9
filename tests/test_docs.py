"""Every README and docs code block runs as printed, or says why it cannot (tests/docs_blocks.py).

Python blocks run in this process, in a fresh folder, after their prelude; bash blocks and
`$ ` transcripts run in bash with this environment's `elastic-loader` on PATH, and a
transcript's printed output is compared with what the docs show. So a renamed argument, a
changed default or a stale figure fails here instead of in a user's terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import loader
from tests.docs_blocks import (
    DOCS,
    ILLUSTRATION,
    REPO,
    Block,
    blocks,
    output_matches,
    transcript,
    unclosed_fences,
)
from tests.docs_preludes import PRELUDES

ALL = blocks()
RUN = [b for b in ALL if b.runs]
COMMAND_TIMEOUT_S = 600
READER_IMPORTS = ["MixedDataset", "StreamingDataLoader", "StreamingDataset", "checkpoint"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def test_every_block_runs_or_says_why() -> None:
    unmarked = [
        b.name for b in ALL if not b.runs and b.mark != "not run" and b.lang not in ILLUSTRATION
    ]
    assert not unmarked, f"blocks neither run nor marked 'not run: reason': {unmarked}"
    no_reason = [b.name for b in ALL if b.mark == "not run" and len(b.argument.split()) < 3]
    assert not no_reason, f"'not run' needs a reason of a few words: {no_reason}"
    unknown = [b.name for b in ALL if b.mark == "with" and b.argument not in PRELUDES]
    assert not unknown, f"preludes that tests/docs_preludes.py lacks: {unknown}"
    assert len(RUN) >= len(ALL) // 3, "most blocks must run; a doc of sketches is no doc"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_fence_closes(path: Path) -> None:
    assert unclosed_fences(path) == [], f"{path.name}: a ``` that never closes"


def _run_python(block: Block, root: Path) -> None:
    given = PRELUDES[block.argument](root) if block.mark == "with" else None
    names: dict[str, Any] = {"__name__": "__docs__"}
    if given:  # a block that continues the page has its imports too
        names.update({name: getattr(loader, name) for name in READER_IMPORTS})
        names.update(given.names)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            exec(compile(block.body, block.name, "exec"), names)
        ours = [w for w in said if Path(w.filename).is_relative_to(REPO / "loader")]
        assert not ours, f"{block.name}: the loader warned: {[str(w.message) for w in ours]}"
    finally:
        os.chdir(cwd)
        for close in given.cleanup if given else []:
            close()


def _run_shell(command: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=root,
        env={**_env(), "REPO": str(REPO)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.name)
def test_block_runs(block: Block, tmp_path: Path) -> None:
    if block.lang == "python" and not block.is_transcript:
        _run_python(block, tmp_path)
        return
    if not block.is_transcript:
        done = _run_shell(block.body, tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return
    # transcripts run as a reader in a fresh clone types them: examples/ at hand, no checkpoints
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for command, shown in transcript(block.body):
        done = _run_shell(command, tmp_path)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        if any(line.strip() for line in shown):
            differs = output_matches(shown, done.stdout)
            assert differs is None, f"$ {command}: {differs}"
