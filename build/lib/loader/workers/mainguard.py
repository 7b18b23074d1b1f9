"""Refuse to start workers from unguarded top-level code of the main script.

Workers started with forkserver or spawn import the main script again (as `__mp_main__`)
before they run, whatever the file's name ends with. Code at its top level that is not
under `if __name__ == "__main__":` runs again in every worker, which tries to start workers
of its own and dies; torch then reports only "DataLoader worker exited unexpectedly". This
check finds, before any worker starts, the main script's line that led to starting them and
says what to add.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from collections.abc import Iterator
from types import FrameType

REIMPORTING = ("spawn", "forkserver")


def check_main_guard(start_method: str | None) -> None:
    """Raise RuntimeError if workers started now would re-run the line that starts them."""
    if start_method not in REIMPORTING:
        return
    main = sys.modules.get("__main__")
    path = _reimported_path(main)
    frame = _main_module_frame(getattr(main, "__dict__", None))
    if path is None or frame is None:
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


def _reimported_path(main: object) -> str | None:
    """The file a spawned child runs again as `__mp_main__`, as multiprocessing decides it:
    a module run with `-m` is re-imported by name (unless it is a package's `__main__`),
    any other script by its path, whatever its name ends with; None when nothing is."""
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(spec_name, str) and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return path


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
    """Line ranges of the top-level `if` branches that a re-import (`__name__` is
    `"__mp_main__"`) surely skips: the body of `if __name__ == "__main__" [and ...]:`,
    `if __name__ in ("__main__",)`, ..., and the `else` of a test it surely passes."""
    try:
        with open(path, encoding="utf-8") as src:
            tree = ast.parse(src.read(), path)
    except (OSError, SyntaxError, ValueError):
        return ((1, sys.maxsize),)  # unreadable: assume guarded rather than refuse wrongly
    blocks = []
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        taken = _value_when_reimported(node.test)
        branch = node.body if taken is False else node.orelse if taken is True else []
        if branch:
            blocks.append((branch[0].lineno, branch[-1].end_lineno or branch[-1].lineno))
    return tuple(blocks)


_UNKNOWN = object()  # a value the script's text alone does not decide


def _value_when_reimported(test: ast.expr) -> object:
    """What `test` evaluates to in a re-imported main script, or _UNKNOWN.

    Only `__name__`, constants, tuples/lists/sets of them, comparisons, `not`, `and`, `or`
    are evaluated; anything else (a call, another name) is unknown, and a branch whose test
    is unknown counts as unguarded.
    """
    if isinstance(test, ast.Name):
        return "__mp_main__" if test.id == "__name__" else _UNKNOWN
    if isinstance(test, ast.Constant):
        return test.value
    if isinstance(test, ast.Tuple | ast.List | ast.Set):
        items = [_value_when_reimported(e) for e in test.elts]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else tuple(items)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = _value_when_reimported(test.operand)
        return _UNKNOWN if value is _UNKNOWN else not value
    if isinstance(test, ast.BoolOp):
        return _bool_op(isinstance(test.op, ast.And), map(_value_when_reimported, test.values))
    if isinstance(test, ast.Compare):
        return _compare(test)
    return _UNKNOWN


def _bool_op(is_and: bool, values: Iterator[object]) -> object:
    """`and`/`or` of values, some unknown: decided as soon as one operand decides it."""
    result: object = is_and
    for value in values:
        if value is _UNKNOWN:
            result = _UNKNOWN
        elif bool(value) is not is_and:
            return not is_and
    return result


_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def _compare(test: ast.Compare) -> object:
    left = _value_when_reimported(test.left)
    for op, right_node in zip(test.ops, test.comparators, strict=True):
        right = _value_when_reimported(right_node)
        compare = _COMPARE.get(type(op))
        if compare is None or left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        try:
            if not compare(left, right):
                return False
        except TypeError:  # e.g. `"x" in 3`: the script would fail there anyway
            return _UNKNOWN
        left = right
    return True
