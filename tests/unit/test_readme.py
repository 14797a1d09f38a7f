"""The README's layout table is the tree a newcomer finds."""

from __future__ import annotations

from tests.conftest import REPO


def test_the_readme_layout_names_every_module_of_shared_and_tools() -> None:
    readme = (REPO / "README.md").read_text()
    layout = readme[readme.index("## Layout") : readme.index("## Development")]
    for package in ("shared", "tools"):
        for path in (REPO / package).glob("*.py"):
            if path.name != "__init__.py":
                assert f"{path.name}`" in layout, f"{package}/{path.name} is not in the README's layout"
    for named in ("functions/", "state_machine/", "layers/", "template.yaml", "tests/", "scripts/", "tools/rehearsal/"):
        assert (REPO / named).exists() and f"`{named}" in layout
