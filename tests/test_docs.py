"""Every README and docs code block runs as printed, or says why it cannot (tests/docs_blocks.py).

Python blocks run in this process, in a fresh folder, after their prelude, as the main
script (`__main__`, from a file that DataLoader workers import again, as `python block.py`
would: so a block that starts workers outside `if __name__ == "__main__":` is refused here
as in a user's script, and one that starts them guarded runs); bash blocks and
`$ ` transcripts run in bash with this environment's `elastic-loader` on PATH, and a
transcript's printed output is compared with what the docs show. So a renamed argument, a
changed default or a stale figure fails here instead of in a user's terminal.
"""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
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


GUARD = "__name__ == '__main__'"  # as ast.unparse writes the test


def unguarded_worker_lines(body: str) -> list[int]:
    """Lines of a block that pass `num_workers=` other than 0 outside a top-level
    `if __name__ == "__main__":` (workers under forkserver or spawn run the rest again)."""
    tree = ast.parse(body)
    guarded = [
        (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == GUARD
    ]
    return [
        call.lineno
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        for kw in call.keywords
        if kw.arg == "num_workers"
        and not (isinstance(kw.value, ast.Constant) and kw.value.value == 0)
        if not any(first <= call.lineno <= last for first, last in guarded)
    ]


def test_blocks_with_workers_show_the_main_guard() -> None:
    """A block copied into a script must run there: with workers it needs the guard."""
    with_workers = [b for b in ALL if b.lang == "python" and "num_workers" in b.body]
    assert len(with_workers) >= 5, "the docs' worker blocks were not found"
    bare = {}
    for block in with_workers:
        try:
            lines = unguarded_worker_lines(block.body)
        except SyntaxError as exc:
            lines = [f"not Python: {exc}"]  # type: ignore[list-item]
        if lines:
            bare[block.name] = lines
    assert not bare, f'blocks with workers outside `if __name__ == "__main__":` (lines): {bare}'


@contextlib.contextmanager
def as_main_script(path: Path, names: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The globals of `path` run as the main script: `sys.modules["__main__"]` is a module
    of that file while the block runs, so the loader's main-guard check reads the block and
    workers import the file again (as `__mp_main__`), as for `python path`."""
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    main.__dict__.update(names)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:
        yield main.__dict__
    finally:
        sys.modules["__main__"] = saved


def _run_python(block: Block, root: Path) -> None:
    given = PRELUDES[block.argument](root) if block.mark == "with" else None
    names: dict[str, Any] = {}
    if given:  # a block that continues the page has its imports too
        names.update({name: getattr(loader, name) for name in READER_IMPORTS})
        names.update(given.names)
    script = root / "block.py"
    script.write_text(block.body)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with warnings.catch_warnings(record=True) as said, as_main_script(script, names) as main:
            warnings.simplefilter("always")
            exec(compile(block.body, str(script), "exec"), main)
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
