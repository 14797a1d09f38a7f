"""ONNX Runtime for the image towers of Classify (ConvNeXt) and Tag (CLIP): exported once, then served by ORT.

The export is cached beside the other built models, keyed by the model source, and loads in onnxruntime
(78 MB) without torch (750 MB): the form a zip-packaged function can carry. ``tests`` check that its outputs
match torch's on the same weights.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.observability import logger
from shared.settings import ModelFiles

_lock = threading.Lock()


def onnx_file(files: ModelFiles, source: str, kind: str) -> Path:
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return files.model_cache_dir / "onnx" / f"{kind}-{digest}.onnx"


def export_once(
    module: Any, example: Any, path: Path, input_name: str, output_name: str, dynamic_size: bool = False
) -> Path:
    """Export ``module`` to ``path`` unless it is there already; the batch axis (and, with ``dynamic_size``,
    height and width) stay dynamic."""
    import torch

    with _lock:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            # Not under no_grad: there, CLIP's attention takes a fused kernel that has no ONNX form.
            with torch.enable_grad():
                torch.onnx.export(
                    module.eval(),
                    (example,),
                    str(partial),
                    input_names=[input_name],
                    output_names=[output_name],
                    dynamic_axes={
                        input_name: {0: "batch", 2: "height", 3: "width"} if dynamic_size else {0: "batch"},
                        output_name: {0: "batch"},
                    },
                    dynamo=False,  # the TorchScript exporter handles both towers; the dynamo one needs onnxscript
                    opset_version=17,
                )
            partial.replace(path)
            logger.info("exported to ONNX", extra={"path": str(path)})
    return path


def session_forward(path: Path, threads: int) -> Callable[[Any], Any]:
    """A torch-in, torch-out forward served by an ONNX Runtime session."""
    import onnxruntime as ort
    import torch

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    def forward(pixels: Any) -> Any:
        return torch.from_numpy(session.run(None, {input_name: pixels.numpy()})[0])

    return forward
