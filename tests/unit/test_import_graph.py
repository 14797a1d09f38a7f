"""The project's modules import one another without a circle: a circle is a piece that belongs one layer lower,
where both sides can import it. Every import counts, at the top of a module, inside a function or for type checks
only, since each says that one module needs the other."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("shared", "tools", "functions")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each of the project's modules, and the project's modules it imports."""
    modules = {_module_name(path): path for package in PACKAGES for path in (REPO / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def test_no_module_imports_one_that_imports_it_back() -> None:
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as circle:
        raise AssertionError(f"an import circle: {' -> '.join(circle.args[1])}") from None
