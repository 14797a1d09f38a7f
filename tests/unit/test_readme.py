"""The README and docs/ say what is there: every link leads to a file, every generated table is its report as the
tools last wrote it, and the layout names every folder a newcomer finds."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Each report the tools write, and the page that shows it as it is.
GENERATED = {
    "bench/cost.md": "docs/performance.md",
    "bench/bench.md": "docs/performance.md",
    "bench/lambda-detect.md": "docs/deploy.md",
    "bench/api.md": "docs/api.md",
    "bench/bulk.md": "docs/performance.md",
    "bench/photo.md": "docs/performance.md",
    "bench/search.md": "docs/performance.md",
    "bench/flops.md": "docs/performance.md",
    "bench/detectors.md": "docs/performance.md",
}


def test_the_readme_is_short_and_links_every_page_of_docs() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert readme.index("make demo") < readme.index("make test") < 1000  # the two commands, first
    for page in (REPO / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"docs/{page.name} is not linked from the README"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file(page) -> None:  # type: ignore[no-untyped-def]
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text()):
        if not re.match(r"^[a-z]+:", target):
            assert (page.parent / target).exists(), f"{page.name} links {target}, which is not there"


def tables(text: str) -> list[str]:
    """Each table of a Markdown text: its consecutive rows."""
    return re.findall(r"(?:^\|.*\n?)+", text, re.MULTILINE)


@pytest.mark.parametrize(("report", "page"), GENERATED.items())
def test_a_generated_table_is_its_report_as_last_written(report: str, page: str) -> None:
    shown = (REPO / page).read_text()
    found = tables((REPO / report).read_text())
    assert found and all(table.rstrip() in shown for table in found), f"{page} does not show {report} as it is"


def test_the_readmes_cost_tables_are_the_cost_reports() -> None:
    report = tables((REPO / "bench/cost.md").read_text())
    [scenarios] = [table for table in report if table.startswith("| scenario | option |")]
    [lanes] = [table for table in report if table.startswith("| images | lane |")]
    readme = (REPO / "README.md").read_text()
    assert scenarios.rstrip() in readme and lanes.rstrip() in readme


def test_the_layout_names_every_folder_and_each_folder_says_what_it_holds() -> None:
    import ast

    development = (REPO / "docs" / "development.md").read_text()
    layout = development[development.index("## Layout") : development.index("## Development")]
    for package in ("shared", "tools"):
        for init in (REPO / package).rglob("__init__.py"):
            folder = init.parent.relative_to(REPO).as_posix()
            assert f"`{folder}/`" in layout, f"{folder}/ is not in the layout (docs/development.md)"
            assert ast.get_docstring(ast.parse(init.read_text())), f"{folder}/__init__.py does not say what it holds"
    for named in ("functions/", "state_machine/", "layers/", "template.yaml", "tests/", "scripts/"):
        assert (REPO / named).exists() and f"`{named}" in layout
