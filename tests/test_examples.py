"""Every example runs as its docstring says, from a fresh clone, and prints what it is for
(#33 items 16 and 18).

A fresh clone has no `data/` and no `checkpoints/`: the examples are copied into a
temporary folder (which becomes their `REPO`) and run there with the loader importable, so
an example that expects a table some other run made fails here as it fails for a new user.
The longer examples' own tests run their commands too (test_main_job.py, test_mesh_example.py,
test_pretrain_example.py); this module holds the helpers and train_ddp's first command.
"""

from __future__ import annotations

import ast
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
COMMAND_TIMEOUT_S = 300

# What each helper prints when run as its docstring says: a line that shows what it is for.
HELPERS = {
    "drills.py": "--crash-at-step K --crash-rank R",
    "local_launch.py": "2 ranks met; all_reduce of their ranks: 1",
    "progress.py": "  demo [########################] 12/12 steps",
    "row_ledger.py": "  epoch 0: 100 rows trained, 100 distinct, each 1-1 time(s)",
}


def documented_commands(example: Path) -> list[str]:
    """The command lines in the example's docstring that run it (`python`/`torchrun` …)."""
    doc = ast.get_docstring(ast.parse(example.read_text())) or ""
    lines = [line.split("#")[0].strip() for line in doc.splitlines()]
    return [
        line
        for line in lines
        if line.startswith(("python ", "torchrun ")) and f"examples/{example.name}" in line
    ]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples as a fresh clone has them: no data, no checkpoints, no caches."""
    root = tmp_path_factory.mktemp("clone")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "examples", root / "examples", ignore=ignore)
    return root


def run(root: Path, command: list[str]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),  # the loader, as an installed package would be
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )


def test_every_example_shows_its_command_and_runs_only_as_a_script() -> None:
    silent = [p.name for p in EXAMPLES if not documented_commands(p)]
    assert not silent, f"examples whose docstring shows no command that runs them: {silent}"
    unguarded = [
        p.name
        for p in EXAMPLES
        if p.name != "quickstart.py" and 'if __name__ == "__main__":' not in p.read_text()
    ]
    assert not unguarded, f"examples with code at import (they are imported too): {unguarded}"


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_each_helper_prints_what_it_is_for(clone: Path, name: str) -> None:
    [command, *_] = documented_commands(REPO / "examples" / name)
    done = run(clone, shlex.split(command.replace("python ", f"{sys.executable} ", 1)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert HELPERS[name] in done.stdout, done.stdout[-2000:]


def test_train_ddp_first_command_makes_its_data_on_a_fresh_clone(clone: Path) -> None:
    """The docstring's first command, where docs/multinode.md leads: rank 0 makes the
    synthetic tables under the clone's data/ (the other ranks wait), all 4 ranks train.
    One epoch instead of 5 (a later flag wins), to keep CI short."""
    first = documented_commands(REPO / "examples" / "train_ddp.py")[0]
    assert first.startswith("torchrun --standalone --nproc-per-node 4 examples/train_ddp.py")
    done = run(clone, [*shlex.split(first), "--epochs", "1"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (clone / "data" / "har.lancedb").is_dir()
    bar = [line for line in done.stderr.splitlines() if "29/29 steps" in line]  # rank 0's
    assert bar and "replicas differ by 0.0e+00" in bar[-1], done.stderr[-3000:]
