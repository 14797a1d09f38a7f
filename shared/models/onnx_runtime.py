"""The models of Detect, Classify and Tag on ONNX Runtime, without torch: where their exports are found, the
sessions, and the image preprocessing the exports expect (Pillow and numpy).

Exports are made by ``annotate models export`` (tools/, with torch) and pushed to the stack by ``annotate models
push``; a function only ever loads one. Each export is a folder with a manifest: a model source that is such a
folder is used as it is, any other (a hub id, a local checkpoint, a ``tiny:`` model) by its export in this
machine's model cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from shared.errors import ModelUnavailable
from shared.models.sources import resolve_model_dir
from shared.observability import logger
from shared.settings import ExportRuntime, ModelFiles

# Raised whenever the files of an export change form, so that no older export is taken for a current one
# (6: Detect's text encoder is a graph of its own).
EXPORT_FORMAT = 6


def find_export(source: str, files: ModelFiles, manifest: str, extra: object = None) -> Path:
    """The export folder of the model ``source`` names (``extra``: what else the export depends on).

    Raises:
        ModelUnavailable: there is none; the message says how to make one.
    """
    folder = resolve_model_dir(source, files)
    if (folder / manifest).is_file():
        return folder
    cached = cached_export_dir(source, folder, files, manifest, extra)
    if not (cached / manifest).is_file():
        raise ModelUnavailable(
            f"{source} is a checkpoint with no ONNX export on this machine: `annotate models export` makes it "
            "(`annotate models push` exports and uploads it; `annotate run` exports what it runs)"
        )
    return cached


def cached_export_dir(source: str, folder: Path, files: ModelFiles, manifest: str, extra: object = None) -> Path:
    """Where this machine keeps the export of the checkpoint in ``folder``: keyed by the source, its weights'
    sizes and times (a rebuilt model gets a new export) and ``extra``."""
    weights = sorted(
        (path.name, path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.iterdir()
        if path.suffix in (".safetensors", ".bin", ".pt")
    )
    key = json.dumps([EXPORT_FORMAT, source, str(folder), weights, extra])
    kind = manifest.removesuffix(".json")
    return files.model_cache_dir / "onnx" / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def weights_file(graph: Path) -> Path:
    """Where the large initializers of an exported model's one graph are (tools/models/onnx_graphs.py)."""
    return graph.with_suffix(".weights")


def openvino_graph_file(graph: Path) -> Path:
    """Where OpenVINO's form of an exported graph is (tools/models/onnx_graphs.py)."""
    return graph.with_suffix(".xml")


def mapped_file(path: Path) -> np.ndarray:
    """The file's bytes, memory-mapped once per process: pages mapped twice would count twice against a
    function's memory. The mapping is private and writable, as OpenVINO takes only writable arrays: nothing
    written to it would reach the file, and no page is copied unless written (neither runtime writes)."""
    mapping = _mapping(path)
    return np.zeros(0, np.uint8) if mapping is None else np.frombuffer(mapping, np.uint8)


def drop_mapped_pages(path: Path) -> None:
    """Let go of the pages of the file's mapping that were read: they are read from the file again if used (no
    runtime writes to the mapping, so nothing is lost). Not a memory file's (an s3:// export in Lambda): its
    pages stay in memory whatever the mapping does, and would only be hidden from the process's count."""
    mapping = _mapping(path)
    if mapping is not None and not path.resolve().name.startswith("memfd:"):
        mapping.madvise(mmap.MADV_DONTNEED)


def _mapping(path: Path) -> mmap.mmap | None:
    status = path.stat()
    return _mapped(path, status.st_ino, status.st_size, status.st_mtime_ns)


@functools.cache
def _mapped(path: Path, inode: int, size: int, modified_ns: int) -> mmap.mmap | None:
    if not size:  # an empty file cannot be mapped (a graph with no large initializer)
        return None
    with path.open("rb") as file:
        return mmap.mmap(file.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def ort_session(graph: Path, threads: int, weights: Path | None = None) -> Any:
    """A CPU session for an exported graph, optimized at export (tools/models/onnx_graphs.py), whose large initializers
    are in the file ``weights`` (by default the graph's own, ``weights_file``), which other graphs may share. The
    session reads them where the file is memory-mapped, without a copy: sessions of one file hold its bytes once
    (on Lambda too, where it is a memory file that ONNX Runtime would refuse to open by its path).

    Raises:
        ModelUnavailable: the weights file is missing (an export of an older form); the message says what to do.
    """
    import onnxruntime as ort

    weights = weights or weights_file(graph)
    if not weights.is_file():
        raise ModelUnavailable(
            f"{graph.parent} lacks {weights.name}: it is an export of an older form; export it again "
            "(`annotate models export`; `annotate models push` for the stack)"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Without the arena a run's buffers go back when it ends: with it, each session (Detect has one per image
    # size) kept its largest run's 2 GB, and three of them outgrew the function's memory.
    options.enable_cpu_mem_arena = False
    # Optimizing again at every cold start took half of the session's creation.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Prepacking copies every matrix weight into a layout of its own, per session: Detect's three sessions held
    # 1.8 GB of copies beside the mapped 0.9 GB, and ran no faster (measured side by side, 3 runs per size).
    options.add_session_config_entry("session.disable_prepacking", "1")
    # Its threads would spin after every run, waiting for another (ONNX Runtime, "Thread management":
    # session.intra_op.allow_spinning, 1 by default), on the cores the next step needs where one process runs the
    # steps one after another (the bulk worker, the API): the caption after Tag took 15-18% longer, side by side, and
    # Classify's and Tag's own runs were no faster for it.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    mapped = mapped_file(weights)
    if mapped.size:
        options.add_session_config_entry("session.use_external_initializer_file_buffers_directly", "1")
        options.add_external_initializers_from_files_in_memory([weights.name], [mapped], [mapped.size])
    return ort.InferenceSession(graph.read_bytes(), options, providers=["CPUExecutionProvider"])


def openvino_session(
    graph: Path, weights: Path, threads: int, compiled_cache: Path | None = None, setting: str = "detector_runtime"
) -> Any:
    """An exported graph in OpenVINO's form (``graph``, its IR: tools/models/onnx_graphs.py), whose constants are in the
    file ``weights``, compiled for this CPU in fp32 (OpenVINO's default on CPUs with bf16 or fp16 is those, which
    change the outputs), run as ONNX Runtime's sessions are. OpenVINO is handed the graph's text and the mapped
    weights, not their paths: an export read from S3 is in memory files, which it cannot open by path.

    With ``compiled_cache``, OpenVINO keeps the compiled model there, keyed by the graph, its weights, OpenVINO's
    version and the options, and marked with the instruction sets it was compiled for; it loads it from there when
    all of them match. A folder that cannot be made is said in the log and done without: the cache only saves time.

    Raises:
        ModelUnavailable: OpenVINO is not installed here (``setting`` asked for it).
    """
    try:
        import openvino
    except ImportError as error:
        raise ModelUnavailable(f"{setting} is openvino, which is not installed here") from error
    core = openvino.Core()
    model = core.read_model(graph.read_bytes(), openvino.Tensor(mapped_file(weights), shared_memory=True))
    options = openvino_options(threads)
    if compiled_cache is not None:
        try:
            compiled_cache.mkdir(parents=True, exist_ok=True)
            options["CACHE_DIR"] = str(compiled_cache)
        except OSError as error:  # OpenVINO would refuse to compile at all
            logger.warning(
                "compiling without OpenVINO's cache", extra={"cache": str(compiled_cache), "error": str(error)}
            )
    compiled = core.compile_model(model, "CPU", options)
    # The compiled model holds its own layout of the weights and reads 7% of the mapped file again as it runs
    # (Detect at 800 px): the pages compiling read would count against the task's or function's memory until
    # the kernel needed them (0.7 GB of Detect's).
    drop_mapped_pages(weights)
    return OpenVinoSession(compiled)


def openvino_options(threads: int) -> dict[str, Any]:
    """How every exported graph is compiled for OpenVINO's CPU plugin: fp32 (its default on CPUs with bf16 or fp16
    units is those), ``threads`` threads, one run at a time."""
    return {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}


def exported_session(
    graph: Path,
    runtime: ExportRuntime,
    threads: int,
    weights: Path,
    compiled_cache: Path | None = None,
    setting: str = "detector_runtime",
) -> Any:
    """A session for an exported ONNX graph on ``runtime``: the graph itself on ONNX Runtime, its OpenVINO form
    (``openvino_session``, named by ``setting`` if OpenVINO is missing) on OpenVINO."""
    if runtime == "openvino":
        return openvino_session(openvino_graph_file(graph), weights, threads, compiled_cache, setting)
    return ort_session(graph, threads, weights)


class OpenVinoSession:
    """A compiled OpenVINO model with ONNX Runtime's ``run``: every output, in the graph's order."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    @property
    def loaded_from_cache(self) -> bool:
        return bool(self.compiled.get_property("LOADED_FROM_CACHE"))

    def run(self, output_names: None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.compiled.create_infer_request().infer(feeds)  # a request per run: runs may be concurrent
        return [results[output] for output in self.compiled.outputs]

    def release_memory(self) -> None:
        """Give back the buffers the model keeps from its runs (none may be running): the next run takes them
        again, about 5% slower (measured at 800x1200)."""
        self.compiled.release_memory()


def as_rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB: itself where it is (Pillow's convert copies even then: 0.03 s at 12 MP)."""
    return image if image.mode == "RGB" else image.convert("RGB")


def resize_short_side(image: Image.Image, short_side: int, resample: Image.Resampling) -> Image.Image:
    """``image`` with its short side ``short_side`` and its aspect kept (the long side rounded down)."""
    width, height = image.size
    if width <= height:
        size = (short_side, int(short_side * height / width))
    else:
        size = (int(short_side * width / height), short_side)
    return image.resize(size, resample)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    left = round((image.width - size) / 2.0)
    top = round((image.height - size) / 2.0)
    return image.crop((left, top, left + size, top + size))


def normalized(images: list[Image.Image], mean: list[float], std: list[float]) -> np.ndarray:
    """A (N, 3, H, W) float32 batch of same-sized RGB images, scaled to [0, 1] and normalized."""
    pixels = np.stack([np.asarray(as_rgb(image), np.float32) for image in images]) / 255.0
    return ((pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(0, 3, 1, 2)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
