"""Zero-shot object detection with Grounding DINO (transformers), returning typed pixel boxes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from PIL import Image

from shared.contracts import Box, Detection
from shared.model_cache import cached_per_settings
from shared.model_sources import prepare_torch, resolve_model_dir
from shared.observability import logger
from shared.settings import DetectionSettings


class Detector(Protocol):
    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]: ...


@dataclass
class GroundingDinoDetector:
    """Grounding DINO with phrase-level labels: each box takes the prompt phrase whose tokens score highest."""

    model: Any
    processor: Any
    short_side: int
    max_detections: int
    nms_iou: float
    bf16: bool = False

    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]:
        """Boxes for ``phrases`` in ``image``, in pixels of ``image``, best first."""
        import torch
        from torchvision.ops import batched_nms

        text, spans = self._text_and_spans(phrases)
        inputs = self.processor(
            images=image,
            text=text,
            return_tensors="pt",
            size={"shortest_edge": self.short_side, "longest_edge": self.short_side * 1333 // 800},
        )
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            outputs = self.model(**inputs)
        token_scores = outputs.logits[0].float().sigmoid()  # (queries, text positions)
        phrase_scores = torch.stack([token_scores[:, start:end].max(dim=1).values for start, end in spans], dim=1)
        scores, labels = phrase_scores.max(dim=1)
        boxes = _pixel_boxes(outputs.pred_boxes[0].float(), image.width, image.height)
        keep = (scores >= max(box_threshold, text_threshold)) & (boxes[:, 2] - boxes[:, 0] >= 1)
        keep &= boxes[:, 3] - boxes[:, 1] >= 1
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        kept = batched_nms(boxes, scores, labels, self.nms_iou)[: self.max_detections]
        return [
            Detection(
                label=phrases[int(labels[i])],
                score=round(float(scores[i]), 4),
                box=Box(
                    **{name: round(float(v), 2) for name, v in zip(("x0", "y0", "x1", "y1"), boxes[i], strict=True)}
                ),
            )
            for i in kept
        ]

    def _text_and_spans(self, phrases: list[str]) -> tuple[str, list[tuple[int, int]]]:
        """The prompt text, and each phrase's token positions in it (after [CLS], before its period)."""
        tokenizer = self.processor.tokenizer
        spans, position = [], 1
        for phrase in phrases:
            length = max(1, len(tokenizer.tokenize(phrase)))
            spans.append((position, position + length))
            position += length + 1  # the phrase, then its "."
        return ". ".join(phrases) + ".", spans


def _pixel_boxes(normalized_cxcywh: Any, width: int, height: int) -> Any:
    import torch

    cx, cy, w, h = normalized_cxcywh.unbind(-1)
    corners = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)
    scale = torch.tensor([width, height, width, height], dtype=corners.dtype)
    return (corners * scale).clamp(min=0).minimum(scale)


@cached_per_settings
def load_detector(settings: DetectionSettings) -> GroundingDinoDetector:
    """The Grounding DINO detector the settings name, loaded once per process."""
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    prepare_torch(settings.torch_threads)
    folder = resolve_model_dir(settings.detector_model, settings)
    model = AutoModelForZeroShotObjectDetection.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    logger.info("detector loaded", extra={"model": settings.detector_model, "folder": str(folder)})
    return GroundingDinoDetector(
        model,
        processor,
        settings.detection_short_side,
        settings.max_detections,
        settings.nms_iou,
        bf16=settings.detector_bf16,
    )
