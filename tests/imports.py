"""The import graph of a package's modules, read from their source (lazy imports inside
functions included), and the check that it has no cycle: the lower module never imports
the upper one."""

from __future__ import annotations

import ast
from pathlib import Path


def import_graph(package: Path, dotted: str) -> dict[str, set[str]]:
    """Each module of `package` (dotted name `dotted`) and the sibling modules it imports."""
    names = {p.stem for p in package.glob("[!_]*.py")}
    graph: dict[str, set[str]] = {}
    for name in names:
        found = set()
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith(f"{dotted}."):
                    found.add(node.module[len(dotted) + 1 :].split(".")[0])
                elif node.module == dotted:  # from loader.tools import rows
                    found.update(a.name for a in node.names if a.name in names)
        graph[name] = found & names
    return graph


def assert_no_cycle(graph: dict[str, set[str]]) -> None:
    """Fails naming the first cycle found, as `a -> b -> a`."""
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for child in sorted(graph[module]):
                visit(child, (*path, module))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())
