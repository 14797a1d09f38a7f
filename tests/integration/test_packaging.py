"""What the Lambda packages leave out must not be needed: a pruned pyarrow still writes the tables, a pruned
OpenVINO still runs an export's IR, and the model functions run without torch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import openvino
import pyarrow
import pytest

from shared.models.onnx_runtime import openvino_session
from shared.settings import Settings
from tests.conftest import REPO, SAMPLES
from tests.unit.test_onnx_graphs import linear_graph
from tools.aws.native_libs import Runtime, lambda_python_runtime, problems
from tools.aws.sam_template import functions, layer_ids, load_template
from tools.models.onnx_graphs import openvino_graphs, share_weights

WRITE_AND_READ = """
import sys
from datetime import UTC, datetime
import pyarrow, pyarrow.parquet as pq
assert pyarrow.__file__.startswith(sys.argv[1]), pyarrow.__file__
from shared.contracts import ImageResult, Status
from shared.storage.objects import store_for
from shared.storage.tables import write_table_files
result = ImageResult(image_id="a" * 16, source_uri="x.jpg", batch_id="b-" + "0" * 20, status=Status.SUCCEEDED,
                     prompt="dog.", processed_at=datetime.now(UTC))
uris = write_table_files([result], sys.argv[2], result.batch_id, datetime.now(UTC), store_for)
print(pq.read_table(uris["images"]).num_rows)
"""


def pruned_site(package: Path, layer: str, tmp_path: Path) -> Path:
    """A copy of an installed package, pruned by its layer's script as the layer ships it."""
    site = tmp_path / "python"
    shutil.copytree(package, site / package.name)
    subprocess.run([str(REPO / "layers" / layer / "prune.sh"), str(site)], check=True)
    return site


def run_with(site: Path, script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter that imports from ``site`` first."""
    return subprocess.run(
        [sys.executable, "-c", script, *arguments],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"},
    )


def test_the_pruned_pyarrow_of_the_arrow_layer_writes_and_reads_the_tables(tmp_path: Path) -> None:
    site = pruned_site(Path(pyarrow.__file__).parent, "arrow", tmp_path)
    assert not list((site / "pyarrow").glob("libarrow_flight*"))

    result = run_with(site, WRITE_AND_READ, str(site), str(tmp_path / "results"))

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


RUN_IR = """
import sys
from pathlib import Path
import numpy as np, openvino
assert openvino.__file__.startswith(sys.argv[1]), openvino.__file__
from shared.models.onnx_runtime import openvino_session
folder = Path(sys.argv[2])
session = openvino_session(folder / "a.xml", folder / "model.weights", 1)
print(session.run(None, {"x": np.ones((2, 64), np.float32)})[0].sum())
"""


def test_the_pruned_openvino_of_its_layer_runs_an_exports_ir(tmp_path: Path) -> None:
    # GIVEN an export's graph in OpenVINO's form, and the openvino of the Detect layer (pruned by its script)
    graph = linear_graph(tmp_path / "a.onnx", "weight", np.ones(32, np.float32))
    openvino_graphs([graph], tmp_path / "model.weights", share_weights([graph], tmp_path / "model.weights"))
    site = pruned_site(Path(openvino.__file__).parent, "openvino", tmp_path)
    assert not list((site / "openvino" / "libs").glob("libopenvino_intel_gpu_plugin*"))

    # WHEN the IR runs with that openvino
    result = run_with(site, RUN_IR, str(site), str(tmp_path))

    # THEN it gives the full openvino's result
    assert result.returncode == 0, result.stderr
    session = openvino_session(tmp_path / "a.xml", tmp_path / "model.weights", 1)
    assert np.float32(result.stdout) == session.run(None, {"x": np.ones((2, 64), np.float32)})[0].sum()


WITHOUT_TORCH = """
import importlib.abc, sys
BLOCKED = {"torch", "torchvision", "transformers", "open_clip", "safetensors", "huggingface_hub"}
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not in Lambda", name=name)
sys.meta_path.insert(0, NoTorch())
from PIL import Image
from shared.models.classification import load_classifier
from shared.models.grounding_onnx import load_detector
from shared.settings import Settings
from shared.models.tagging import load_tagger
from shared.models.segmentation import load_segmenter
settings = Settings.model_validate_json(sys.argv[1])
image = Image.open(sys.argv[2]).convert("RGB")
boxes = load_detector(settings.detection).detect(image, ["cat", "traffic light"], 0.0, 0.0)
crops = [image.crop((b.box.x0, b.box.y0, b.box.x1, b.box.y1)) for b in boxes[:3]]
labels = [b.label for b in boxes[:3]]
classes = load_classifier(settings.describe).classify(crops, labels, 2)
tags = load_tagger(settings.describe).tag(crops, labels, {"color": ["red", "brown"]})
masks = load_segmenter(settings.segment).segment(image, [b.box for b in boxes[:3]])
blocked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(len(boxes), len(classes), len(tags), len(masks), blocked)
"""


def test_detect_classify_tag_and_segment_run_with_torch_unavailable(tiny_settings: Settings) -> None:
    # GIVEN a process in which torch, transformers and open_clip cannot be imported, as in Lambda
    # WHEN Detect's, Classify's, Tag's and Segment's models load from their exports and run
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, tiny_settings.model_dump_json(), str(SAMPLES / "chelsea-the-cat.jpg")],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    # THEN they give boxes, classes, tags and masks, and nothing of torch was imported
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-5:] == ["20", "3", "3", "3", "[]"]


def _built_shared_library(folder: Path, name: str, source: str, *flags: str) -> Path:
    """A shared library compiled here from C ``source``, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "source.c").write_text(source)
    library = folder / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(folder / "source.c"), *flags], check=True)
    return library


OPENMP_SOURCE = "#include <omp.h>\nint threads(void) { return omp_get_max_threads(); }\n"
THREAD_SOURCE = (
    "#include <pthread.h>\nint start(pthread_t *t, void *(*f)(void *)) { return pthread_create(t, 0, f, 0); }\n"
)


def test_a_library_needing_openmp_or_a_newer_glibc_than_lambdas_is_named(tmp_path: Path) -> None:
    # GIVEN a package with a library that needs libgomp (as llama.cpp's ggml did), and one built against glibc 2.34
    _built_shared_library(tmp_path / "package", "libneedsgomp.so", OPENMP_SOURCE, "-fopenmp")
    _built_shared_library(tmp_path / "package" / "sub", "libthreads.so", THREAD_SOURCE, "-pthread")
    # WHEN it is checked against Lambda's runtime, and against one whose glibc stops at 2.33
    found = problems(tmp_path / "package")
    runtime = lambda_python_runtime()
    older = Runtime(
        runtime.libraries, runtime.versions | {"GLIBC": frozenset(v for v in runtime.versions["GLIBC"] if v != "2.34")}
    )
    # THEN the OpenMP library is named, with what it needs; and the glibc 2.34 symbol only fails the older runtime
    assert found == ["libneedsgomp.so needs libgomp.so.1, which is neither in the package nor in the runtime"]
    # (and a build step that checks the folder fails, naming it)
    check = subprocess.run(
        [sys.executable, "-m", "tools.aws.native_libs", str(tmp_path / "package")], capture_output=True, text=True
    )
    assert check.returncode == 1 and "libneedsgomp.so needs libgomp.so.1" in check.stdout, check
    assert (
        problems(tmp_path / "package", older)[-1]
        == "sub/libthreads.so needs GLIBC_2.34, newer than the runtime's GLIBC_2.33"
    )
    # AND a library the package ships itself is found there
    _built_shared_library(
        tmp_path / "package" / "libs", "libgomp.so.1", "int omp_get_max_threads(void) { return 1; }\n"
    )
    assert problems(tmp_path / "package") == []


def test_every_layer_recipe_fails_its_build_on_a_library_lambda_cannot_load() -> None:
    # sam build runs the Makefile's build-<Layer> recipe: each checks what it built, so a layer built on a machine
    # whose compiler or libraries Lambda lacks never reaches a deployment
    recipes = re.findall(r"^build-(\w+):\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert {name for name, _ in recipes} >= {
        "SharedLayer",
        "ArrowLayer",
        "ApiLayer",
        "OnnxLayer",
        "OpenVinoLayer",
        "LlamaCppLayer",
    }
    for name, body in recipes:
        assert body.strip().splitlines()[-1].strip() == '$(NATIVE_CHECK) "$(ARTIFACTS_DIR)/python"', name


@pytest.mark.slow
def test_every_shared_library_of_every_layer_loads_on_lambdas_python_runtime(tmp_path: Path) -> None:
    # GIVEN every layer as scripts/package.py builds it: Lambda's Python 3.12 wheels, llama.cpp compiled portably
    import importlib.util

    spec = importlib.util.spec_from_file_location("package_script", REPO / "scripts" / "package.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    layers = {layer for f in functions(load_template()).values() for layer in layer_ids(f["Properties"]["Layers"])}
    # WHEN each layer's libraries are checked against the runtime's (auditwheel's manylinux_2_34 policy)
    found = {layer: problems(script.build_layer(layer, tmp_path)) for layer in sorted(layers)}
    # THEN every one loads: each needed library is in the layer or the runtime, no symbol is newer than its
    assert found == {layer: [] for layer in layers}


# The bulk image's base (python:3.12-slim) is Debian bookworm, glibc 2.36: any manylinux wheel up to 2.36 installs.
BULK_BASE_MANYLINUX = ("2014", "_2_28", "_2_31", "_2_34", "_2_35", "_2_36")


def _pinned(requirements: Path) -> list[str]:
    """Each pinned requirement of ``requirements``, its ``-r`` includes followed."""
    pinned = []
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pinned += _pinned(requirements.parent / line.removeprefix("-r ").strip())
        elif line:
            pinned.append(line)
    return pinned


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_bulk_image_installs_from_wheels_on_either_architecture(machine: str, tmp_path: Path) -> None:
    # GIVEN the bulk image's requirements, but llama-cpp-python, which its build stage compiles for the platform
    wanted = [req for req in _pinned(REPO / "layers/bulk-image/requirements.txt") if "llama-cpp-python" not in req]
    platforms = [option for tag in BULK_BASE_MANYLINUX for option in ("--platform", f"manylinux{tag}_{machine}")]
    # WHEN pip resolves them, and what they need, for CPython 3.12 on that architecture, from wheels only
    resolved = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", "3.12",
         *platforms, "--dest", str(tmp_path), *wanted],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # THEN every one has a wheel: `docker buildx build --platform linux/amd64,linux/arm64` compiles only llama.cpp
    assert resolved.returncode == 0, resolved.stderr[-2000:]
    names = {wheel.name.split("-")[0].lower().replace("_", "-") for wheel in tmp_path.glob("*.whl")}
    assert {"openvino", "onnxruntime", "pyarrow", "numpy", "pycocotools"} <= names
    native = [wheel.name for wheel in tmp_path.glob("*.whl") if not wheel.name.endswith("-none-any.whl")]
    assert native and all(machine in name for name in native), native
