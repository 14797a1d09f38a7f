"""Exported graphs made quick to load: optimized once here, and their large initializers moved into one weights
file that several graphs share, so that a function does not optimize at every cold start and maps the bytes once
(shared/onnx_runtime.py's ``ort_session``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

# Below this an initializer (a shape, a scale) stays in its graph.
SHARED_MIN_BYTES = 1024
_ALIGNMENT = 64  # bytes, for the CPU kernels' loads


def finish_graphs(traced: dict[Path, Path], weights_file: Path) -> None:
    """Write each traced graph (``traced``: its file -> the graph's file) optimized, remove it, and move the
    graphs' large initializers into ``weights_file``."""
    for source, graph in traced.items():
        optimize_offline(source, graph)
        source.unlink()
    share_weights(list(traced.values()), weights_file)


def optimize_offline(graph: Path, optimized: Path) -> None:
    """Write ``graph`` as ONNX Runtime optimizes it for the CPU. ORT_ENABLE_EXTENDED's fusions hold on any x86
    or arm64 CPU; ORT_ENABLE_ALL would add layouts for this machine's vector width, which Lambda's may lack."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def share_weights(graphs: list[Path], weights_file: Path) -> None:
    """Move the large initializers of ``graphs`` (rewritten in place) into ``weights_file``, each distinct
    tensor once: the graphs of one model at several input sizes name theirs differently."""
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
