"""Build each function's package as Lambda receives it and report its unzipped size against the limit.

Every function is a zip package: the function folder plus its layers, with Lambda's Python 3.12 manylinux
wheels, against the 250 MB unzipped limit (code and layers together). No torch: Detect runs its export on
OpenVINO, Classify and Tag theirs on ONNX Runtime.

    .venv/bin/python scripts/package.py [--out build/package]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.aws.sam_template import by_default, functions, layer_ids, load_template  # noqa: E402

TEMPLATE = load_template()

# As the Makefile's build-LlamaCppLayer: every Lambda CPU, and no OpenMP (Lambda's runtime has no libgomp).
LLAMA_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF"
MB = 1_000_000
ZIP_LIMIT_MB = 250
# Lambda's python3.12 runtime is Amazon Linux 2023 (glibc 2.34): manylinux_2_28 wheels and older run on it.
LAMBDA_WHEELS = [
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--only-binary=:all:",
]


def pip_install(target: Path, *arguments: str) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--target",
        str(target),
        *arguments,
    ]
    subprocess.run(command, check=True, cwd=REPO)


def tree_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def zipped_size(folder: Path, archive: Path) -> int:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                bundle.write(path, path.relative_to(folder))
    return archive.stat().st_size


def build_layer(name: str, out: Path) -> Path:
    folder = out / "layers" / name
    if folder.exists():
        return folder
    python = folder / "python"
    if name == "SharedLayer":
        pip_install(python, *LAMBDA_WHEELS, "-r", "layers/shared/requirements.txt")
        subprocess.run(["layers/shared/prune.sh", str(python)], check=True, cwd=REPO)
        shutil.copytree(REPO / "shared", python / "shared", ignore=shutil.ignore_patterns("__pycache__"))
    elif name == "ArrowLayer":
        pip_install(python, *LAMBDA_WHEELS, "-r", "layers/arrow/requirements.txt")
        subprocess.run(["layers/arrow/prune.sh", str(python)], check=True, cwd=REPO)
    elif name == "OnnxLayer":
        pip_install(python, *LAMBDA_WHEELS, "--no-deps", "-r", "layers/onnx/requirements.txt")
    elif name == "ApiLayer":
        pip_install(python, *LAMBDA_WHEELS, "--no-deps", "-r", "layers/api/requirements.txt")
    elif name == "OpenVinoLayer":
        pip_install(python, *LAMBDA_WHEELS, "--no-deps", "-r", "layers/openvino/requirements.txt")
        subprocess.run(["layers/openvino/prune.sh", str(python)], check=True, cwd=REPO)
    elif name == "LlamaCppLayer":
        wheels = subprocess.run(
            ["scripts/native_wheels.sh", sys.executable, "llama-cpp-python==0.3.36"],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "CMAKE_ARGS": LLAMA_CMAKE_ARGS},
        ).stdout.strip()
        pip_install(python, "--no-deps", "--find-links", wheels, "llama-cpp-python==0.3.36")
        subprocess.run(["layers/llama-cpp/prune.sh", str(python)], check=True, cwd=REPO)
        pip_install(python, *LAMBDA_WHEELS, "--no-deps", "diskcache==5.6.3", "jinja2==3.1.6", "markupsafe==3.0.3")
    else:
        raise SystemExit(f"no recipe for layer {name}")
    return folder


def deployed_layers(resource: dict) -> list:
    """The function's layers as the template deploys them by default."""
    return by_default(TEMPLATE, resource["Properties"].get("Layers", []))


def zip_function(name: str, resource: dict, out: Path) -> tuple[int, int]:
    properties = resource["Properties"]
    code = REPO / properties["CodeUri"]
    function_dir = out / "functions" / name
    shutil.rmtree(function_dir, ignore_errors=True)
    shutil.copytree(code, function_dir, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    layers = [build_layer(layer, out) for layer in layer_ids(deployed_layers(resource))]
    unzipped = tree_size(function_dir) + sum(tree_size(layer) for layer in layers)
    zipped = zipped_size(function_dir, out / f"{name}.zip") + sum(
        zipped_size(layer, out / f"{layer.name}.zip") for layer in layers
    )
    return unzipped, zipped


def package_problems(name: str, resource: dict, out: Path) -> list[str]:
    """What would keep one of the function's shared libraries (in its folder or its layers) from loading on Lambda."""
    from tools.aws.native_libs import problems

    folders = [out / "functions" / name] + [out / "layers" / layer for layer in layer_ids(deployed_layers(resource))]
    return [f"{folder.name}/{problem}" for folder in folders for problem in problems(folder)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "package")
    arguments = parser.parse_args()
    out = arguments.out
    out.mkdir(parents=True, exist_ok=True)
    rows, unloadable = [], []
    for name, resource in sorted(functions(TEMPLATE).items()):
        size, zipped = zip_function(name, resource, out)
        rows.append((name, size / MB, zipped, ZIP_LIMIT_MB))
        unloadable += [f"{name}: {problem}" for problem in package_problems(name, resource, out)]
    lines = [
        "| function | unzipped MB | zipped MB | limit MB | fits |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {name} | {size:.1f} | {zipped / MB:.1f} | {limit:,} | {'yes' if size < limit else 'NO'} |"
            for name, size, zipped, limit in rows
        ),
    ]
    report = "\n".join(lines)
    (out / "report.md").write_text(report + "\n")
    print(report)
    print("\n".join(unloadable) or "every shared library loads on Lambda's python3.12 runtime")
    if any(size >= limit for _, size, _, limit in rows):
        raise SystemExit("a package is over its limit")
    if unloadable:
        raise SystemExit("a shared library would not load on Lambda")


if __name__ == "__main__":
    main()
