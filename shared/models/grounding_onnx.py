"""Grounding DINO served by ONNX Runtime (or OpenVINO: `detector_runtime`), without torch: the exported graph
prompt tokenized by `tokenizers`, the image resized and normalized with Pillow and numpy.

Each export takes one image size. An image is resized as the model card's processor resizes it (short side, long
side capped), then padded at the bottom and right to the smallest exported size that holds it, with a pixel mask
that tells the model which pixels are padding, as transformers does for a batch of differently sized images.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict

from shared.contracts import Detection
from shared.detector_geometry import ImageSize, resized_size, smallest_holding
from shared.errors import ImageRejected, ModelUnavailable, RequestRejected
from shared.models.cache import cached_per_settings
from shared.models.detection import Detector, phrase_detections, phrase_spans
from shared.models.onnx_runtime import as_rgb, exported_session, find_export, normalized, openvino_graph_file
from shared.observability import logger
from shared.settings import DetectionSettings, ExportRuntime

EXPORT_MANIFEST = "grounding-dino-export.json"
WEIGHTS_FILE = "grounding-dino.weights"  # the large initializers of every graph, mapped once
TEXT_GRAPH = "grounding-dino-text.onnx"  # the text encoder, run once per prompt; each size's graph takes its output
ENCODED_PROMPTS_KEPT = 16


class ExportManifest(BaseModel):
    """What an export folder holds and how its inputs are made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    sizes: list[ImageSize]
    short_side: int
    longest_edge: int
    image_mean: list[float]
    image_std: list[float]
    special_token_ids: list[int]
    max_text_len: int
    int8: bool = False  # weights quantized (dynamic int8): lossy
    max_queries: int = 900  # decoder queries kept, at most: fewer is lossy


def export_dir(settings: DetectionSettings) -> Path:
    """The folder of the export Detect runs (shared/models/onnx_runtime.py says where exports are found).

    Raises:
        ModelUnavailable: there is no export at the settings' sizes; the message says how to make one.
    """
    return find_export(settings.detector_model, settings, EXPORT_MANIFEST, export_key(settings))


def export_key(settings: DetectionSettings) -> list[object]:
    """What, beside the checkpoint, an export depends on."""
    return [settings.export_sizes(), settings.detector_int8, settings.detector_max_queries]


def export_file_name(size: ImageSize) -> str:
    return f"grounding-dino-{size[0]}x{size[1]}.onnx"


def is_export(folder: Path) -> bool:
    return (folder / EXPORT_MANIFEST).is_file()


def phrase_masks(input_ids: np.ndarray, special_token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Grounding DINO's text self-attention mask (each phrase sees itself; every token sees itself) and position
    ids (counted from each phrase's start), for one tokenized prompt of shape (1, tokens)."""
    ids = input_ids[0]
    count = len(ids)
    special = np.isin(ids, special_token_ids)
    positions = np.arange(count)
    previous = np.maximum.accumulate(np.where(special, positions, -1))
    previous = np.concatenate([[-1], previous[:-1]])
    following = np.minimum.accumulate(np.where(special, positions, count)[::-1])[::-1]
    in_phrase = (following != 0) & (following != count - 1) & (following != count)
    mask = (following[:, None] == following[None, :]) & in_phrase[None, :]
    mask |= np.eye(count, dtype=bool)
    position_ids = np.where(in_phrase, positions - previous - 1, 0).clip(min=0)
    return mask[None], position_ids[None].astype(np.int64)


@dataclass
class OnnxGroundingDino:
    """Detector (shared/models/detection.py) on the export: the text encoder's session, and one per exported size made
    on the first image of that size (or all at load: ``detector_load_all_sizes``, before Lambda's snapshot), all
    reading one copy of the weights (OpenVINO also keeps its own layout of the matrices, per graph)."""

    folder: Path
    manifest: ExportManifest
    tokenizer: Any
    runtime: ExportRuntime
    threads: int
    max_detections: int
    nms_iou: float
    compiled_cache: Path | None = None  # where OpenVINO keeps what it compiled, if anywhere
    _sessions: dict[ImageSize, Any] = field(default_factory=dict)
    _text: Any = None
    _encoded: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _run_lock: threading.Lock = field(default_factory=threading.Lock)

    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]:
        outputs = self.forward(image, phrases)
        return phrase_detections(
            outputs["logits"][0],
            outputs["pred_boxes"][0],
            phrase_spans(phrases, self.token_count),
            phrases,
            (image.width, image.height),
            min_score=max(box_threshold, text_threshold),
            nms_iou=self.nms_iou,
            max_detections=self.max_detections,
        )

    def token_count(self, phrase: str) -> int:
        return len(self.tokenizer.encode(phrase, add_special_tokens=False).ids)

    def forward(self, image: Image.Image, phrases: list[str]) -> dict[str, Any]:
        """The graph's outputs for ``image`` and the prompt of ``phrases``: boxes are relative to the image, not
        to its padding (the pixel mask tells the model which is which)."""
        pixels, pixel_mask = self.image_inputs(image)
        feeds = {"pixel_values": pixels, "pixel_mask": pixel_mask, **self.encoded_text(". ".join(phrases) + ".")}
        size = (pixels.shape[2], pixels.shape[3])
        session = self.session(size)
        if self.runtime == "onnxruntime":  # its sessions keep no buffers between runs, and may run side by side
            logits, boxes, selection = session.run(None, feeds)
        else:
            # An OpenVINO size keeps its run's buffers (about 1 GB at 800 px, a long prompt): only the size that
            # runs keeps them, so that Detect's memory holds one size's, not four
            with self._run_lock:
                for other_size, other in self._sessions.items():
                    if other_size != size:
                        other.release_memory()
                logits, boxes, selection = session.run(None, feeds)
        return {"logits": logits, "pred_boxes": boxes, "selection_scores": selection}

    def encoded_text(self, text: str) -> dict[str, np.ndarray]:
        """A size graph's text inputs for the prompt ``text``: the text encoder runs once for the last few
        prompts (a batch asks one prompt of all its images)."""
        with self._lock:
            if text in self._encoded:
                return self._encoded[text]
        inputs = self.text_inputs(text)
        (text_hidden,) = self.text_session().run(
            None, {name: inputs[name] for name in ("input_ids", "token_type_ids", "text_mask", "position_ids")}
        )
        encoded = {name: inputs[name] for name in ("attention_mask", "text_mask", "position_ids")}
        encoded["text_hidden"] = text_hidden
        with self._lock:
            if len(self._encoded) >= ENCODED_PROMPTS_KEPT:
                del self._encoded[next(iter(self._encoded))]
            self._encoded[text] = encoded
        return encoded

    def image_inputs(self, image: Image.Image) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (1, 3, H, W) normalized and padded to an exported size, and their mask."""
        manifest = self.manifest
        height, width = resized_size(image.height, image.width, manifest.short_side, manifest.longest_edge)
        size = smallest_holding(manifest.sizes, (height, width))
        if size is None:  # larger than every export: fit it inside the largest, aspect kept
            largest = max(manifest.sizes, key=lambda s: s[0] * s[1])
            scale = min(largest[0] / height, largest[1] / width)
            height, width = int(height * scale), int(width * scale)
            size = largest
            logger.info("image shrunk to the largest exported size", extra={"size": f"{height}x{width}"})
        if min(height, width) < 1:
            raise ImageRejected(
                f"{image.width}x{image.height} is too thin to detect in: at the detector's resolution its short side is"
                f" under one pixel (the long side may be at most about {2 * manifest.longest_edge} times the short)"
            )
        resized = as_rgb(image).resize((width, height), Image.Resampling.BILINEAR)
        pixels = np.zeros((1, 3, *size), np.float32)
        pixels[:, :, :height, :width] = normalized([resized], manifest.image_mean, manifest.image_std)
        mask = np.zeros((1, *size), np.int64)
        mask[0, :height, :width] = 1
        return pixels, mask

    def text_inputs(self, text: str) -> dict[str, np.ndarray]:
        ids = self.tokenizer.encode(text).ids
        if len(ids) > self.manifest.max_text_len:
            raise RequestRejected(
                f"the prompt is {len(ids)} tokens; Grounding DINO reads at most {self.manifest.max_text_len}"
            )
        input_ids = np.asarray([ids], np.int64)
        text_mask, position_ids = phrase_masks(input_ids, self.manifest.special_token_ids)
        return {
            "input_ids": input_ids,
            "token_type_ids": np.zeros_like(input_ids),
            "attention_mask": np.ones_like(input_ids),
            "text_mask": text_mask,
            "position_ids": position_ids,
        }

    @property
    def loaded_sizes(self) -> list[ImageSize]:
        return list(self._sessions)

    def session(self, size: ImageSize) -> Any:
        with self._lock:
            if size not in self._sessions:
                self._sessions[size] = self._load(export_file_name(size))
                logger.info("detector session ready", extra={"size": f"{size[0]}x{size[1]}", "runtime": self.runtime})
            return self._sessions[size]

    def text_session(self) -> Any:
        with self._lock:
            if self._text is None:
                self._text = self._load(TEXT_GRAPH)
            return self._text

    def _load(self, graph_name: str) -> Any:
        weights = self.folder / WEIGHTS_FILE
        return exported_session(self.folder / graph_name, self.runtime, self.threads, weights, self.compiled_cache)


def load_onnx_detector(folder: Path, settings: DetectionSettings) -> OnnxGroundingDino:
    """The exported detector in ``folder`` on ``detector_runtime``, its sizes loaded now or on first use
    (``detector_load_all_sizes``).

    Raises:
        ModelUnavailable: ``folder`` holds no export, or the export's files are incomplete.
    """
    from tokenizers import Tokenizer

    if not is_export(folder):
        raise ModelUnavailable(f"{folder} holds no Grounding DINO export; `annotate models export` makes one")
    manifest = ExportManifest.model_validate_json((folder / EXPORT_MANIFEST).read_text())
    graphs = [TEXT_GRAPH, *(export_file_name(size) for size in manifest.sizes)]
    if settings.detector_runtime == "openvino":
        graphs = [openvino_graph_file(Path(graph)).name for graph in graphs]
    missing = [name for name in [*graphs, WEIGHTS_FILE] if not (folder / name).is_file()]
    if missing:
        raise ModelUnavailable(
            f"the export in {folder} lacks {', '.join(missing)}: export it again (`annotate models export`; "
            "`annotate models push` for the stack)"
        )
    made_for = (manifest.short_side, manifest.int8, manifest.max_queries)
    wanted = (settings.detection_short_side, settings.detector_int8, settings.detector_max_queries)
    if made_for != wanted:
        raise ModelUnavailable(
            f"the export in {folder} is for (short side, int8, max queries) {made_for}, not {wanted}"
        )
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    detector = OnnxGroundingDino(
        folder,
        manifest,
        tokenizer,
        settings.detector_runtime,
        settings.torch_threads,
        settings.max_detections,
        settings.nms_iou,
        settings.model_cache_dir / "openvino" if settings.detector_compiled_cache else None,
    )
    if settings.detector_load_all_sizes:
        detector.text_session()
        for size in manifest.sizes:
            detector.session(size)
    return detector


def is_omdet_turbo(settings: DetectionSettings) -> bool:
    """Whether ``detector_model`` names OmDet-Turbo (its export, or a checkpoint of that model type) rather than
    Grounding DINO's family."""
    import json

    from shared.models.omdet_onnx import is_omdet_export
    from shared.models.sources import resolve_model_dir

    folder = resolve_model_dir(settings.detector_model, settings)
    config = folder / "config.json"
    return is_omdet_export(folder) or (
        config.is_file() and json.loads(config.read_text()).get("model_type") == "omdet-turbo"
    )


@cached_per_settings
def load_detector(settings: DetectionSettings) -> Detector:
    """The detector the settings name, from its export (made by ``annotate models export``, uploaded by ``annotate
    models push``), loaded once per process: Grounding DINO's family (MM Grounding DINO and LLMDet load into the
    same export), or OmDet-Turbo (shared/models/omdet_onnx.py)."""
    if is_omdet_turbo(settings):
        from shared.models.omdet_onnx import OMDET_MANIFEST, load_omdet_detector

        omdet = load_omdet_detector(find_export(settings.detector_model, settings, OMDET_MANIFEST), settings)
        logger.info("detector loaded", extra={"model": settings.detector_model, "sizes": [omdet.manifest.size]})
        return omdet
    detector = load_onnx_detector(export_dir(settings), settings)
    logger.info("detector loaded", extra={"model": settings.detector_model, "sizes": detector.manifest.sizes})
    return detector
