"""Exported graphs made quick to load: optimized once here, and their large initializers moved into one weights
file that several graphs share, so that a function does not optimize at every cold start and maps the bytes once
(shared/models/onnx_runtime.py's ``ort_session``). Each graph also gets OpenVINO's form of it, whose constants are read
from that same weights file (``openvino_graphs``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from shared.models.onnx_runtime import openvino_graph_file

# Below this an initializer (a shape, a scale) stays in its graph.
SHARED_MIN_BYTES = 1024
_ALIGNMENT = 64  # bytes, for the CPU kernels' loads


def finish_graphs(traced: dict[Path, Path], weights_file: Path, openvino: bool = False) -> None:
    """Write each traced graph (``traced``: its file -> the graph's file) optimized, remove it, and move the
    graphs' large initializers into ``weights_file`` (``openvino``: and write each graph's OpenVINO form)."""
    for source, graph in traced.items():
        optimize_offline(source, graph)
        source.unlink()
    stored = share_weights(list(traced.values()), weights_file)
    if openvino:
        openvino_graphs(list(traced.values()), weights_file, stored)


def optimize_offline(graph: Path, optimized: Path) -> None:
    """Write ``graph`` as ONNX Runtime optimizes it for the CPU. ORT_ENABLE_EXTENDED's fusions hold on any x86
    or arm64 CPU; ORT_ENABLE_ALL would add layouts for this machine's vector width, which Lambda's may lack."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def share_weights(graphs: list[Path], weights_file: Path) -> dict[bytes, int]:
    """Move the large initializers of ``graphs`` (rewritten in place) into ``weights_file``, each distinct
    tensor once: the graphs of one model at several input sizes name theirs differently. Returns where the file
    holds each tensor's bytes, by their SHA-256."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    offsets: dict[tuple[bytes, str, tuple[int, ...]], int] = {}
    with weights_file.open("wb") as out:
        for graph in graphs:
            model = onnx.load(graph)
            for initializer in model.graph.initializer:
                array = np.ascontiguousarray(numpy_helper.to_array(initializer))
                if array.nbytes < SHARED_MIN_BYTES:
                    continue
                data = array.tobytes()
                key = (hashlib.sha256(data).digest(), array.dtype.name, array.shape)
                if key not in offsets:
                    out.write(b"\0" * (-out.tell() % _ALIGNMENT))
                    offsets[key] = out.tell()
                    out.write(data)
                initializer.CopyFrom(numpy_helper.from_array(array, initializer.name))
                set_external_data(initializer, weights_file.name, offsets[key], len(data))
                initializer.ClearField("raw_data")
            onnx.save_model(model, graph)
    stored: dict[bytes, int] = {}
    for (digest, _, _), offset in offsets.items():  # the same bytes as two dtypes or shapes: the first copy
        stored.setdefault(digest, offset)
    return stored


def openvino_graphs(graphs: list[Path], weights_file: Path, stored: dict[bytes, int]) -> None:
    """Write each ONNX graph of ``graphs`` as OpenVINO reads it (its IR, ``openvino_graph_file``), with every
    constant read from ``weights_file``: where it holds the same bytes (``stored``: offsets by SHA-256, as
    ``share_weights`` returns them), else from a few bytes appended to the file. OpenVINO then loads a graph from
    its text and the weights' bytes, wherever those are (an export read from S3 is in memory files, which it cannot
    open by path), and no size of the model stores its own copy of the weights (OpenVINO's own IR writes one per
    graph)."""
    import tempfile
    import xml.etree.ElementTree as ElementTree

    import openvino

    offsets = dict(stored)
    appended = bytearray()
    end = weights_file.stat().st_size
    core = openvino.Core()
    with tempfile.TemporaryDirectory() as scratch:
        for graph in graphs:
            ir = Path(scratch) / "graph.xml"
            openvino.save_model(core.read_model(graph), ir, compress_to_fp16=False)
            own_weights = np.fromfile(ir.with_suffix(".bin"), np.uint8)
            tree = ElementTree.parse(ir)
            for layer in tree.getroot().iter("layer"):
                data = layer.find("data")
                if layer.get("type") != "Const" or data is None or "offset" not in data.attrib:
                    continue
                start, size = int(data.get("offset", 0)), int(data.get("size", 0))
                constant = own_weights[start : start + size]
                digest = hashlib.sha256(constant.tobytes()).digest()
                if digest not in offsets:
                    appended += b"\0" * (-(end + len(appended)) % _ALIGNMENT)
                    offsets[digest] = end + len(appended)
                    appended += constant.tobytes()
                data.set("offset", str(offsets[digest]))
            tree.write(openvino_graph_file(graph))
    with weights_file.open("ab") as out:
        out.write(appended)
