"""The README's quickstart runs as printed, and stays within 25 lines."""

from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_block_runs(tmp_path: Path) -> None:
    text = README.read_text()
    section = text[text.index("## Quickstart") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    lines = [line for line in code.group(1).splitlines() if line.strip()]
    assert len(lines) <= 25
    cwd = os.getcwd()
    os.chdir(tmp_path)  # it writes checkpoints/quickstart.json
    try:
        exec(compile(code.group(1), "README quickstart", "exec"), {})
    finally:
        os.chdir(cwd)
    assert (tmp_path / "checkpoints" / "quickstart.json").is_file()
