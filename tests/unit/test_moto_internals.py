"""moto's internals are reached through one module (tools/aws/moto_internals.py): an upgrade of moto that moves one
fails here, by name, and nowhere else imports them."""

from __future__ import annotations

import ast

from tests.conftest import REPO

PUBLIC = {"moto", "moto.server"}  # mock_aws, and the threaded server


def test_each_internal_the_project_uses_imports() -> None:
    from tools.aws import moto_internals

    missing = [name for name in moto_internals.__all__ if getattr(moto_internals, name, None) is None]
    assert not missing and len(moto_internals.__all__) >= 30


def test_no_other_module_imports_moto_s_internals() -> None:
    found = []
    for path in [*(REPO / "tools").rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "shared").rglob("*.py")]:
        if path.name == "moto_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.relative_to(REPO)}: {name}" for name in names if name.startswith("moto") and name not in PUBLIC
            ]
    assert not found, found
