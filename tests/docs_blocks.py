"""The code blocks of the README and docs/, as the docs test runs them.

A fenced block is meant to run unless the line right above its fence says otherwise:

    <!-- docs-test: not run: REASON -->       never run; REASON says why (and what covers it)
    <!-- docs-test: with NAME -->             run after the prelude NAME (tests/docs_preludes.py)

`python` blocks are executed; `bash` blocks run in bash; a block whose first line starts
with `$ ` is a transcript: each `$ ` line is a command, the lines after it its printed
output, compared with what the command prints now (a line `…` stands for any lines; JSON
output is compared as JSON, floats to 1e-6 relative, `seconds` ignored). `text` blocks are
illustrations (layouts, schemas), never code; any other block needs a mark.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ILLUSTRATION = {"text", "yaml", "json", "promql"}
_FENCE = re.compile(r"^(`{3,})([\w+-]*)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*docs-test:\s*(not run|with)\s*:?\s*(.*?)\s*-->")
ANY_LINES = "…"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    mark: str | None  # "not run" or "with"
    argument: str  # the reason, or the prelude's name

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def is_transcript(self) -> bool:
        return self.body.lstrip().startswith("$ ")

    @property
    def runs(self) -> bool:
        if self.mark == "not run" or self.lang in ILLUSTRATION:
            return False
        return self.lang in {"python", "bash"} or self.is_transcript


def blocks(paths: list[Path] = DOCS) -> list[Block]:
    found = []
    for path in paths:
        text = path.read_text()
        for fence in _FENCE.finditer(text):
            before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            found.append(
                Block(
                    path=path,
                    line=text.count("\n", 0, fence.start()) + 1,
                    lang=fence.group(2),
                    body=fence.group(3),
                    mark=mark.group(1) if mark else None,
                    argument=mark.group(2) if mark else "",
                )
            )
    return found


def unclosed_fences(path: Path) -> list[int]:
    """Lines of fences that never close (a ``` opened and not closed swallows the page)."""
    text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    return [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith("```")]


def transcript(body: str) -> list[tuple[str, list[str]]]:
    """[(command, shown output lines)] of a `$ ` block; a trailing `# …` comment is dropped."""
    steps: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            command = re.sub(r"\s+#.*$", "", line[2:]).strip()
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def shown_output(command: str, paths: list[Path] = DOCS) -> list[list[str]]:
    """The outputs the docs show for `command` (a transcript's `$ ` line, without comment)."""
    return [
        shown
        for block in blocks(paths)
        if block.is_transcript
        for typed, shown in transcript(block.body)
        if typed == command
    ]


def output_matches(shown: list[str], printed: str) -> str | None:
    """None when `printed` is what the docs show, else the first difference, in words."""
    text = "\n".join(shown).strip()
    if text.startswith("{"):
        try:
            return _json_differs(json.loads(text), json.loads(printed), "$")
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc}"
    return _lines_differ([line.rstrip() for line in shown], printed.rstrip().splitlines())


def _lines_differ(shown: list[str], printed: list[str]) -> str | None:
    i = 0
    for k, want in enumerate(shown):
        if want.strip() == ANY_LINES:
            rest = [w for w in shown[k + 1 :] if w.strip() != ANY_LINES]
            if not rest:
                return None
            while i < len(printed) and printed[i].rstrip() != rest[0]:
                i += 1
            continue
        if i >= len(printed):
            return f"the docs show {want!r}; the output ended"
        if printed[i].rstrip() != want:
            return f"the docs show {want!r}; printed {printed[i].rstrip()!r}"
        i += 1
    if i < len(printed):
        return f"printed more than the docs show, from {printed[i]!r}"
    return None


def _json_differs(want: Any, got: Any, where: str) -> str | None:
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            return f"{where}: keys {sorted(want)} in the docs, {sorted(got)} printed"
        for key in want:
            if key == "seconds":
                continue
            found = _json_differs(want[key], got[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{where}: {len(want)} items in the docs, {len(got)} printed"
        for k, (a, b) in enumerate(zip(want, got, strict=True)):
            found = _json_differs(a, b, f"{where}[{k}]")
            if found:
                return found
        return None
    if isinstance(want, float) or isinstance(got, float):
        if (
            isinstance(want, int | float)
            and isinstance(got, int | float)
            and not isinstance(want, bool)
            and math.isclose(want, got, rel_tol=1e-6, abs_tol=1e-12)
        ):
            return None
    elif want == got and type(want) is type(got):
        return None
    return f"{where}: {want!r} in the docs, {got!r} printed"
