"""Refuse to start workers from unguarded top-level code of the main script.

Workers started with forkserver or spawn import the main script again (as `__mp_main__`)
before they run. Code at its top level that is not under `if __name__ == "__main__":`
runs again in every worker, which tries to start workers of its own and dies; torch then
reports only "DataLoader worker exited unexpectedly". This check finds, before any worker
starts, the main script's line that led to starting them and says what to add.
"""

from __future__ import annotations

import ast
import functools
import sys
from types import FrameType

REIMPORTING = ("spawn", "forkserver")


def check_main_guard(start_method: str | None) -> None:
    """Raise RuntimeError if workers started now would re-run the line that starts them."""
    if start_method not in REIMPORTING:
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame = _main_module_frame(getattr(main, "__dict__", None))
    if not isinstance(path, str) or not path.endswith(".py") or frame is None:
        return  # an interactive session, `python -c`, a notebook: nothing is re-imported
    line = frame.f_lineno
    if any(first <= line <= last for first, last in _guarded_blocks(path)):
        return
    raise RuntimeError(
        f"{path}, line {line}: DataLoader workers are started from the top level of the main "
        f'script without `if __name__ == "__main__":`. Workers started with {start_method!r} '
        f"import the main script again, run that line too and die ('worker exited "
        f"unexpectedly'). Put the script's top-level code under `if __name__ == "
        f'"__main__":` (e.g. `def main(): ...` and `if __name__ == "__main__": main()`)'
    )


def _main_module_frame(main_globals: object) -> FrameType | None:
    """The frame running the main script's top-level code, if it is on this stack."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=8)
def _guarded_blocks(path: str) -> tuple[tuple[int, int], ...]:
    """Line ranges of the top-level `if __name__ == "__main__":` bodies of a script."""
    try:
        with open(path, encoding="utf-8") as src:
            tree = ast.parse(src.read(), path)
    except (OSError, SyntaxError, ValueError):
        return ((1, sys.maxsize),)  # unreadable: assume guarded rather than refuse wrongly
    return tuple(
        (node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno)
        for node in tree.body
        if isinstance(node, ast.If) and _is_main_test(node.test)
    )


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1
