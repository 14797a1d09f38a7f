"""OmDet-Turbo served from its export (tools/models/omdet_export.py) without torch: a detector a user may pick
instead of Grounding DINO (``detector_model``: a checkpoint whose model type is ``omdet-turbo``), about five times
faster on this CPU at a lower published COCO AP (docs/performance.md, "The detector a user picks").

Its prompt is the phrases as class names and a task sentence naming them ("Detect dog, cat."), as transformers'
processor writes it; CLIP's text encoder (a graph of its own) encodes both once per prompt. Every image is resized
to the one square size the model takes (its image processor's), so one graph serves all images. Each query gets
each phrase's sigmoid score; the best (query, phrase) pairs above the threshold are kept, and overlapping boxes of
one phrase merged, as the processor's post-processing does.
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
from shared.detector_geometry import ImageSize
from shared.errors import ModelUnavailable
from shared.models.detection import as_detections, non_max_suppression
from shared.models.onnx_runtime import as_rgb, exported_session, normalized, openvino_graph_file
from shared.observability import logger
from shared.settings import DetectionSettings, ExportRuntime

OMDET_MANIFEST = "omdet-turbo-export.json"
OMDET_GRAPH = "omdet-turbo.onnx"
OMDET_TEXT_GRAPH = "omdet-turbo-text.onnx"
OMDET_WEIGHTS = "omdet-turbo.weights"
ENCODED_PROMPTS_KEPT = 16


class OmDetManifest(BaseModel):
    """What an OmDet-Turbo export folder holds and how its inputs are made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    size: ImageSize  # every image is resized to it
    resample: int  # Pillow's filter, as the checkpoint's image processor names it (pixels rescaled by 1/255)
    image_mean: list[float]
    image_std: list[float]
    max_text_len: int  # CLIP's context: longer class names and tasks are cut, as the processor cuts them
    task_template: str  # the task sentence, its "{}" the phrases joined by ", "
    queries: int


def is_omdet_export(folder: Path) -> bool:
    return (folder / OMDET_MANIFEST).is_file()


@dataclass
class OnnxOmDetTurbo:
    """Detector (shared/models/detection.py) on OmDet-Turbo's export."""

    folder: Path
    manifest: OmDetManifest
    tokenizer: Any
    image_session: Any
    text_session: Any
    max_detections: int
    nms_iou: float
    _encoded: dict[tuple[str, ...], dict[str, np.ndarray]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]:
        logits, boxes = self.forward(image, phrases)
        # each (query, phrase) pair is a candidate, as the processor's post-processing ranks them
        scores = 1 / (1 + np.exp(-logits[0].astype(np.float64)))
        best = np.argsort(-scores.ravel(), kind="stable")[: self.manifest.queries]
        queries, labels = np.unravel_index(best, scores.shape)
        pair_scores = scores[queries, labels]
        cx, cy, w, h = np.moveaxis(boxes[0][queries].astype(np.float64), -1, 0)
        scale = np.asarray([image.width, image.height] * 2, np.float64)
        corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1) * scale
        keep = pair_scores > max(box_threshold, text_threshold)
        corners, pair_scores, labels = corners[keep], pair_scores[keep], labels[keep]
        # merged before they are cut to the image, as the processor does
        kept = non_max_suppression(corners, pair_scores, labels, self.nms_iou)
        corners = np.minimum(corners.clip(min=0), scale)
        kept = [i for i in kept if corners[i, 2] - corners[i, 0] >= 1 and corners[i, 3] - corners[i, 1] >= 1]
        return as_detections(phrases, labels, pair_scores, corners, kept[: self.max_detections])

    def forward(self, image: Image.Image, phrases: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each query's logit per phrase (1, queries, phrases) and box (1, queries, 4: centre, size; relative)."""
        feeds = {"pixel_values": self.image_inputs(image), **self.encoded_prompt(phrases)}
        logits, boxes, _ = self.image_session.run(None, feeds)
        return logits, boxes

    def image_inputs(self, image: Image.Image) -> np.ndarray:
        height, width = self.manifest.size
        resized = as_rgb(image).resize((width, height), Image.Resampling(self.manifest.resample))
        return normalized([resized], self.manifest.image_mean, self.manifest.image_std)

    def encoded_prompt(self, phrases: list[str]) -> dict[str, np.ndarray]:
        """The graph's prompt inputs: each phrase's class embedding (phrases, 1, dim), the task sentence's token
        features (tokens, 1, dim) and its mask, encoded once for the last few prompts."""
        key = tuple(phrases)
        with self._lock:
            if key in self._encoded:
                return self._encoded[key]
        task = self.manifest.task_template.format(", ".join(phrases))
        class_ids = [self.token_ids(phrase) for phrase in phrases]
        task_ids = self.token_ids(task)
        classes = [self._text(ids)[1][0] for ids in class_ids]
        task_hidden = self._text(task_ids)[0]
        encoded = {
            "class_features": np.stack(classes)[:, None, :],
            "task_features": task_hidden.transpose(1, 0, 2),
            "task_mask": np.ones((1, task_hidden.shape[1]), np.int64),
        }
        with self._lock:
            if len(self._encoded) >= ENCODED_PROMPTS_KEPT:
                del self._encoded[next(iter(self._encoded))]
            self._encoded[key] = encoded
        return encoded

    def token_ids(self, text: str) -> np.ndarray:
        """The tokens of ``text``, cut to CLIP's context with its end token kept, as the processor cuts them (a
        long task sentence names fewer phrases than the prompt has; each phrase still has its class embedding)."""
        encoding = self.tokenizer.encode(text)
        if encoding.overflowing:
            logger.info("text cut to the detector's context", extra={"tokens": self.manifest.max_text_len})
        return np.asarray([encoding.ids], np.int64)

    def _text(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """CLIP's token features (1, tokens, dim) and its projected embedding at the end token (1, dim). CLIP's
        attention is causal: without padding, each token's features are those the processor's padded call gives."""
        hidden, pooled = self.text_session.run(None, {"input_ids": ids})
        return hidden, pooled


def load_omdet_detector(folder: Path, settings: DetectionSettings) -> OnnxOmDetTurbo:
    """The OmDet-Turbo export in ``folder`` on ``detector_runtime``.

    Raises:
        ModelUnavailable: the folder's export is incomplete.
    """
    from tokenizers import Tokenizer

    manifest = OmDetManifest.model_validate_json((folder / OMDET_MANIFEST).read_text())
    runtime: ExportRuntime = settings.detector_runtime
    graphs = [OMDET_GRAPH, OMDET_TEXT_GRAPH]
    named = [openvino_graph_file(folder / g).name for g in graphs] if runtime == "openvino" else graphs
    missing = [name for name in [*named, OMDET_WEIGHTS, "tokenizer.json"] if not (folder / name).is_file()]
    if missing:
        raise ModelUnavailable(f"the export in {folder} lacks {', '.join(missing)}: export it again")
    cache = settings.model_cache_dir / "openvino" if settings.detector_compiled_cache else None

    def session(graph: str) -> Any:
        return exported_session(folder / graph, runtime, settings.torch_threads, folder / OMDET_WEIGHTS, cache)

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(manifest.max_text_len)  # the special tokens kept within it, as the processor's
    return OnnxOmDetTurbo(
        folder,
        manifest,
        tokenizer,
        session(OMDET_GRAPH),
        session(OMDET_TEXT_GRAPH),
        settings.max_detections,
        settings.nms_iou,
    )
