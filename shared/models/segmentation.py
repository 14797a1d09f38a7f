"""A mask for each detected box, by a SAM-family model (EdgeTAM by default) exported to ONNX: the image encoder
runs once per image, the boxes go to the mask decoder as one batch of prompts (tools/models/segment_export.py
makes both graphs). Masks are kept as COCO run-length encodings (pycocotools), each within its box."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict

from shared.contracts import Box, BoxMask
from shared.models.cache import cached_per_settings
from shared.models.onnx_runtime import as_rgb, find_export, normalized, ort_session, weights_file
from shared.observability import logger
from shared.settings import SegmentSettings
from shared.storage.masks import encoded

SEGMENTER_MANIFEST = "segmenter-export.json"
SEGMENTER_EXPORT_VERSION = 1  # part of the cached export's key: raised when the graphs change form
IMAGE_GRAPH = "segmenter-image.onnx"
DECODER_GRAPH = "segmenter-decoder.onnx"
# The image graph's outputs, which the decoder graph takes with the boxes: the decoder's two high-resolution
# feature maps and the image embedding
FEATURE_NAMES = ["features_0", "features_1", "image_embedding"]


class SegmenterExport(BaseModel):
    """An exported promptable segmenter: its square input size and normalization (its processor's), and its
    weights' identity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    revision: str
    image_size: int
    image_mean: list[float]
    image_std: list[float]
    mask_threshold: float = 0.0


class Segmenter(Protocol):
    name: str
    revision: str

    def segment(self, image: Image.Image, boxes: list[Box]) -> list[BoxMask | None]: ...


def upsampling_weights(source: int, target: int, start: int, stop: int) -> np.ndarray:
    """The rows ``start:stop`` of the (target x source) matrix that resizes a line of ``source`` values to ``target``
    bilinearly with half-pixel centres (torch's ``interpolate(mode="bilinear", align_corners=False)``, which the
    processor's ``post_process_masks`` uses): only a box's rows and columns are ever computed."""
    positions = np.maximum((np.arange(start, stop, dtype=np.float64) + 0.5) * (source / target) - 0.5, 0.0)
    lower = np.minimum(np.floor(positions).astype(np.int64), source - 1)
    upper = np.minimum(lower + 1, source - 1)
    fraction = positions - lower
    weights = np.zeros((stop - start, source), np.float64)
    rows = np.arange(stop - start)
    np.add.at(weights, (rows, lower), 1.0 - fraction)
    np.add.at(weights, (rows, upper), fraction)
    return weights


def box_window(box: Box, width: int, height: int) -> tuple[int, int, int, int]:
    """The pixels a box covers (every pixel it touches), within the image: its mask is computed there only."""
    x0, y0 = max(0, int(np.floor(box.x0))), max(0, int(np.floor(box.y0)))
    x1, y1 = min(width, int(np.ceil(box.x1))), min(height, int(np.ceil(box.y1)))
    return x0, y0, x1, y1


def mask_in_box(logits: np.ndarray, box: Box, width: int, height: int, threshold: float) -> np.ndarray | None:
    """The (height, width) mask of one box: the decoder's low-resolution logits resized to the image as the
    processor does, thresholded, kept within the box. None for a box that covers no pixel."""
    x0, y0, x1, y1 = box_window(box, width, height)
    if x1 <= x0 or y1 <= y0:
        return None
    rows = upsampling_weights(logits.shape[0], height, y0, y1)
    columns = upsampling_weights(logits.shape[1], width, x0, x1)
    window = rows @ logits.astype(np.float64) @ columns.T
    mask = np.zeros((height, width), np.uint8, order="F")  # column-major: the order COCO's encoding reads
    mask[y0:y1, x0:x1] = window > threshold
    return mask


@dataclass
class OnnxSegmenter:
    """The exported image encoder and mask decoder: one encoder run per image, one decoder run for its boxes."""

    name: str
    export: SegmenterExport
    image_session: Any
    decoder_session: Any

    @property
    def revision(self) -> str:
        return self.export.revision

    def features(self, image: Image.Image) -> list[np.ndarray]:
        size = self.export.image_size
        pixels = normalized(
            [as_rgb(image).resize((size, size), Image.Resampling.BILINEAR)],
            self.export.image_mean,
            self.export.image_std,
        )
        return list(self.image_session.run(None, {"pixel_values": pixels}))

    def mask_logits(self, features: list[np.ndarray], boxes: list[Box], width: int, height: int) -> tuple[Any, Any]:
        """The decoder's low-resolution mask logits and predicted IoU for each box (boxes in the image's pixels)."""
        scale = np.asarray([self.export.image_size / width, self.export.image_size / height] * 2, np.float32)
        prompts = np.asarray([[b.x0, b.y0, b.x1, b.y1] for b in boxes], np.float32)[None] * scale
        return tuple(
            self.decoder_session.run(None, dict(zip(FEATURE_NAMES, features, strict=True)) | {"boxes": prompts})
        )

    def segment(self, image: Image.Image, boxes: list[Box]) -> list[BoxMask | None]:
        if not boxes:
            return []
        logits, scores = self.mask_logits(self.features(image), boxes, image.width, image.height)
        masks = []
        for box, box_logits, score in zip(boxes, logits, scores, strict=True):
            mask = mask_in_box(box_logits, box, image.width, image.height, self.export.mask_threshold)
            masks.append(None if mask is None else encoded(mask, float(score)))
        return masks


@cached_per_settings
def load_segmenter(settings: SegmentSettings) -> OnnxSegmenter:
    """The segmenter the settings name, from its export, loaded once per process.

    Raises:
        ModelUnavailable: no export of it (the message says how to make one).
    """
    folder = find_export(settings.segment_model, settings, SEGMENTER_MANIFEST, SEGMENTER_EXPORT_VERSION)
    export = SegmenterExport.model_validate_json((folder / SEGMENTER_MANIFEST).read_text())
    image_graph, decoder_graph = folder / IMAGE_GRAPH, folder / DECODER_GRAPH
    weights = weights_file(image_graph)  # both graphs' large initializers: one file
    segmenter = OnnxSegmenter(
        name=settings.segment_model,
        export=export,
        image_session=ort_session(image_graph, settings.torch_threads, weights),
        decoder_session=ort_session(decoder_graph, settings.torch_threads, weights),
    )
    logger.info("segmenter loaded", extra={"model": settings.segment_model, "image_size": export.image_size})
    return segmenter
