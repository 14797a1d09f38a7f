"""The house's shape, as docs/development.md draws it: no import circle between the project's modules (a circle is a
piece that belongs one layer lower, where both sides can import it; every import counts, at the top of a module,
inside a function or for type checks only), no import up or across the layers, and no long module that does not say
why it is one piece."""

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


def drawn_layers() -> list[list[str]]:
    """docs/development.md's picture of the layers, top row first: each row's folders as package names."""
    text = (REPO / "docs" / "development.md").read_text()
    block = text.split("<!-- layers: top to bottom -->", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return [[folder.replace("/", ".") for folder in line.split()] for line in block.splitlines() if line.strip()]


def _row_of(module: str, rows: list[list[str]]) -> tuple[int, str]:
    """The row and folder of the deepest package in the picture that holds ``module``."""
    holding = [
        (len(folder), row, folder)
        for row, folders in enumerate(rows)
        for folder in folders
        if module == folder or module.startswith(folder + ".")
    ]
    assert holding, f"{module} is in no folder of docs/development.md's layers"
    _, row, folder = max(holding)
    return row, folder


def test_every_import_goes_down_the_layers_docs_development_draws() -> None:
    rows = drawn_layers()
    assert len(rows) >= 8, rows
    upward = []
    for module, imported in import_graph().items():
        if not imported:  # a package's docstring (tools/__init__.py) imports nothing, so it sits in no row
            continue
        row, folder = _row_of(module, rows)
        for other in imported:
            other_row, other_folder = _row_of(other, rows)
            if other_row < row or (other_row == row and other_folder != folder):
                upward.append(f"{module} ({folder}) imports {other} ({other_folder})")
    assert not upward, "imports up or across the layers:\n" + "\n".join(sorted(upward))


def test_a_module_over_500_lines_says_at_its_top_why_it_is_one_piece() -> None:
    long = [
        path.relative_to(REPO).as_posix()
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if len(path.read_text().splitlines()) > 500
        and "One piece:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert not long, f"over 500 lines, and not saying why they are one piece: {long}"
