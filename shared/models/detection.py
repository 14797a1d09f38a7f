"""Zero-shot object detection with Grounding DINO: the detector's port (shared/models/grounding_onnx.py runs and loads
it) and the post-processing that turns its outputs into typed pixel boxes, each labelled with one prompt phrase."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from PIL import Image

from shared.contracts import Box, Detection


class Detector(Protocol):
    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]: ...


def phrase_spans(phrases: list[str], token_count: Callable[[str], int]) -> list[tuple[int, int]]:
    """Each phrase's token positions in the prompt "a. b. c." (after [CLS], before the phrase's period)."""
    spans, position = [], 1
    for phrase in phrases:
        length = max(1, token_count(phrase))
        spans.append((position, position + length))
        position += length + 1  # the phrase, then its "."
    return spans


def phrase_detections(
    logits: np.ndarray,
    normalized_cxcywh: np.ndarray,
    spans: list[tuple[int, int]],
    phrases: list[str],
    image_size: tuple[int, int],
    min_score: float,
    nms_iou: float,
    max_detections: int,
) -> list[Detection]:
    """Detections from one image's outputs (queries x text positions, queries x 4): each query takes the phrase
    whose tokens score highest (its best token), boxes below ``min_score`` or under a pixel wide are dropped,
    overlapping boxes of one phrase are merged, the best ``max_detections`` are kept."""
    labels, scores = best_phrases(logits, spans)
    boxes = pixel_boxes(normalized_cxcywh.astype(np.float64), *image_size)
    keep = (scores >= min_score) & (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
    boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
    kept = non_max_suppression(boxes, scores, labels, nms_iou)[:max_detections]
    return as_detections(phrases, labels, scores, boxes, kept)


def as_detections(
    phrases: list[str], labels: np.ndarray, scores: np.ndarray, corners: np.ndarray, kept: list[int]
) -> list[Detection]:
    """The ``kept`` candidates as typed detections: each one's phrase, its score and its pixel corners, rounded."""
    return [
        Detection(
            label=phrases[int(labels[i])],
            score=round(float(scores[i]), 4),
            box=Box(**{name: round(float(v), 2) for name, v in zip(("x0", "y0", "x1", "y1"), corners[i], strict=True)}),
        )
        for i in kept
    ]


def best_phrases(logits: np.ndarray, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the phrase whose best token scores highest, and that score (a probability)."""
    token_scores = 1 / (1 + np.exp(-logits.astype(np.float64)))
    phrase_scores = np.stack([token_scores[:, start:end].max(axis=1) for start, end in spans], axis=1)
    return phrase_scores.argmax(axis=1), phrase_scores.max(axis=1)


def pixel_boxes(normalized_cxcywh: np.ndarray, width: int, height: int) -> np.ndarray:
    """Corner boxes in pixels, clamped to the image."""
    cx, cy, w, h = np.moveaxis(normalized_cxcywh, -1, 0)
    corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    scale = np.asarray([width, height, width, height], dtype=corners.dtype)
    return np.minimum((corners * scale).clip(min=0), scale)


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, iou: float) -> list[int]:
    """Indices kept, best first: a box overlapping a better box of the same label by more than ``iou`` goes."""
    order = np.argsort(-scores, kind="stable")
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    kept: list[int] = []
    suppressed = np.zeros(len(boxes), dtype=bool)
    for index in order:
        if suppressed[index]:
            continue
        kept.append(int(index))
        top_left = np.maximum(boxes[index, :2], boxes[:, :2])
        bottom_right = np.minimum(boxes[index, 2:], boxes[:, 2:])
        overlap = np.prod((bottom_right - top_left).clip(min=0), axis=1)
        union = areas[index] + areas - overlap
        suppressed |= (labels == labels[index]) & (overlap > iou * union)
    return kept
