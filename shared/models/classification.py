"""Per-box image classification on ONNX Runtime or OpenVINO: an exported ConvNeXt (transformers), or an exported
traced TorchScript model with its labels (tools/models/describe_export.py makes both)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict

from shared.contracts import ClassScore
from shared.errors import ModelUnavailable
from shared.models.cache import cached_per_settings
from shared.models.onnx_runtime import (
    as_rgb,
    center_crop,
    exported_session,
    find_export,
    normalized,
    openvino_graph_file,
    resize_short_side,
    softmax,
    weights_file,
)
from shared.observability import logger
from shared.settings import DescribeSettings

_ID_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
TORCHSCRIPT_FILE = "torchscript.pt"
LABELS_FILE = "labels.txt"


class Classifier(Protocol):
    def classify(self, crops: list[Image.Image], box_labels: list[str], top_k: int) -> list[list[ClassScore]]: ...


def allowed_class_ids(entries: list[str], labels: list[str]) -> list[int]:
    """Class ids named by ``entries``: exact class names or id ranges such as '151-268'.

    Raises:
        ModelUnavailable: an entry names no class of this model (the filter and the model do not match).
    """
    ids: set[int] = set()
    for entry in entries:
        if match := _ID_RANGE.match(entry):
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            if last >= len(labels) or first > last:
                raise ModelUnavailable(f"class filter range {entry!r} is outside the model's {len(labels)} classes")
            ids.update(range(first, last + 1))
        elif entry in labels:
            ids.add(labels.index(entry))
        else:
            raise ModelUnavailable(f"class filter names {entry!r}, which is not a class of the classifier")
    return sorted(ids)


CLASSIFIER_MANIFEST = "classifier-export.json"
CLASSIFIER_GRAPH = "classifier.onnx"


class ClassifierExport(BaseModel):
    """An exported image classifier: its class names and the preprocessing its processor does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    labels: list[str]
    resize_short_side: int  # then a center crop of crop_size, or, when equal to it, a plain resize to a square
    crop_size: int
    bicubic: bool
    image_mean: list[float]
    image_std: list[float]

    def preprocess(self, crops: list[Image.Image]) -> np.ndarray:
        resample = Image.Resampling.BICUBIC if self.bicubic else Image.Resampling.BILINEAR
        if self.resize_short_side == self.crop_size:
            sized = [as_rgb(crop).resize((self.crop_size, self.crop_size), resample) for crop in crops]
        else:
            sized = [
                center_crop(resize_short_side(as_rgb(crop), self.resize_short_side, resample), self.crop_size)
                for crop in crops
            ]
        return normalized(sized, self.image_mean, self.image_std)


@dataclass
class ImageClassifier:
    """Scores a batch of crops in one forward; a box whose label has a filter is scored on those classes only."""

    forward: Callable[[list[Image.Image]], np.ndarray]  # crops -> logits
    labels: list[str]
    class_filter: dict[str, list[str]] = field(default_factory=dict)
    _allowed: dict[str, list[int]] = field(default_factory=dict)

    def classify(self, crops: list[Image.Image], box_labels: list[str], top_k: int) -> list[list[ClassScore]]:
        if not crops:
            return []
        logits = self.forward(crops).astype(np.float64)
        results = []
        for row, box_label in zip(logits, box_labels, strict=True):
            allowed = self._allowed_for(box_label)
            if allowed is not None:
                masked = np.full_like(row, -np.inf)
                masked[allowed] = row[allowed]
                row = masked
            probabilities = softmax(row)
            best = np.argsort(-probabilities, kind="stable")[: min(top_k, len(allowed or self.labels))]
            results.append([ClassScore(label=self.labels[i], score=round(float(probabilities[i]), 4)) for i in best])
        return results

    def _allowed_for(self, box_label: str) -> list[int] | None:
        if box_label not in self.class_filter:
            return None
        if box_label not in self._allowed:
            self._allowed[box_label] = allowed_class_ids(self.class_filter[box_label], self.labels)
        return self._allowed[box_label]


@cached_per_settings
def load_classifier(settings: DescribeSettings) -> ImageClassifier:
    """The classifier the settings name, from its export on ``classifier_runtime``, loaded once per process.

    Raises:
        ModelUnavailable: no export, or openvino asked for where it is not installed.
    """
    folder = find_export(settings.classifier_model, settings, CLASSIFIER_MANIFEST)
    export = ClassifierExport.model_validate_json((folder / CLASSIFIER_MANIFEST).read_text())
    graph, runtime = folder / CLASSIFIER_GRAPH, settings.classifier_runtime
    if runtime == "openvino" and not openvino_graph_file(graph).is_file():
        # An export pushed before exports had OpenVINO's form: the same classes on the slower runtime beat none.
        logger.warning(
            "the classifier's export has no OpenVINO form: on ONNX Runtime until it is exported again "
            "(`annotate models push`)",
            extra={"model": settings.classifier_model},
        )
        runtime = "onnxruntime"
    session = exported_session(
        graph, runtime, settings.torch_threads, weights_file(graph), setting="classifier_runtime"
    )
    logger.info(
        "classifier loaded",
        extra={"model": settings.classifier_model, "classes": len(export.labels), "runtime": runtime},
    )
    return ImageClassifier(
        forward=lambda crops: session.run(None, {"pixel_values": export.preprocess(crops)})[0],
        labels=export.labels,
        class_filter=dict(settings.class_filter or {}),
    )
