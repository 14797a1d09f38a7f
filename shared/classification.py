"""Per-box image classification: a ConvNeXt through transformers, or a traced TorchScript model with labels."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from PIL import Image

from shared.contracts import ClassScore
from shared.errors import ModelUnavailable
from shared.model_cache import cached_per_settings
from shared.model_sources import prepare_torch, resolve_model_dir
from shared.observability import logger
from shared.settings import DescriptionSettings

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


@dataclass
class ImageClassifier:
    """Scores a batch of crops in one forward; a box whose label has a filter is scored on those classes only."""

    forward: Callable[[Any], Any]  # pixel batch -> logits
    preprocess: Callable[[list[Image.Image]], Any]
    labels: list[str]
    class_filter: dict[str, list[str]] = field(default_factory=dict)
    _allowed: dict[str, list[int]] = field(default_factory=dict)

    def classify(self, crops: list[Image.Image], box_labels: list[str], top_k: int) -> list[list[ClassScore]]:
        import torch

        if not crops:
            return []
        with torch.inference_mode():
            logits = self.forward(self.preprocess(crops)).float()
        results = []
        for row, box_label in zip(logits, box_labels, strict=True):
            allowed = self._allowed_for(box_label)
            if allowed is not None:
                masked = torch.full_like(row, float("-inf"))
                masked[allowed] = row[allowed]
                row = masked
            probabilities = row.softmax(dim=-1)
            best = probabilities.topk(min(top_k, len(allowed) if allowed is not None else len(self.labels)))
            results.append(
                [
                    ClassScore(label=self.labels[int(i)], score=round(float(p), 4))
                    for p, i in zip(best.values, best.indices, strict=True)
                ]
            )
        return results

    def _allowed_for(self, box_label: str) -> list[int] | None:
        if box_label not in self.class_filter:
            return None
        if box_label not in self._allowed:
            self._allowed[box_label] = allowed_class_ids(self.class_filter[box_label], self.labels)
        return self._allowed[box_label]


@cached_per_settings
def load_classifier(settings: DescriptionSettings) -> ImageClassifier:
    """The classifier the settings name, loaded once per process."""
    prepare_torch(settings.torch_threads)
    folder = resolve_model_dir(settings.classifier_model, settings)
    if (folder / TORCHSCRIPT_FILE).is_file():
        classifier = _load_torchscript(folder)
    else:
        classifier = _load_transformers(folder, settings)
    classifier.class_filter = dict(settings.class_filter or {})
    logger.info("classifier loaded", extra={"model": settings.classifier_model, "classes": len(classifier.labels)})
    return classifier


def _load_transformers(folder: Path, settings: DescriptionSettings) -> ImageClassifier:
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    processor = AutoImageProcessor.from_pretrained(folder)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).logits

    forward: Callable[[Any], Any] = Logits()
    if settings.describe_runtime == "onnx":
        from shared.onnx_runtime import export_once, onnx_file, session_forward

        path = onnx_file(settings, settings.classifier_model, "classifier")
        export_once(Logits(), torch.rand(1, 3, 224, 224), path, "pixel_values", "logits", dynamic_size=True)
        forward = session_forward(path, settings.torch_threads)
    return ImageClassifier(
        forward=forward,
        preprocess=lambda crops: processor(images=crops, return_tensors="pt")["pixel_values"],
        labels=labels,
    )


def _load_torchscript(folder: Path) -> ImageClassifier:
    """A traced model (``torchscript.pt``), its class names (``labels.txt``, one a line) and, optionally,
    ``preprocess.json`` ({"size": 224, "mean": [...], "std": [...]}; ImageNet's by default)."""
    import torch
    from torchvision.transforms import v2

    labels_path = folder / LABELS_FILE
    if not labels_path.is_file():
        raise ModelUnavailable(f"{folder / TORCHSCRIPT_FILE} needs its class names in {labels_path}")
    labels = [line.strip() for line in labels_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    options = {"size": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    if (folder / "preprocess.json").is_file():
        options |= json.loads((folder / "preprocess.json").read_text())
    transform = v2.Compose(
        [
            v2.PILToTensor(),
            v2.Resize((options["size"], options["size"]), antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(options["mean"], options["std"]),
        ]
    )
    module = torch.jit.load(str(folder / TORCHSCRIPT_FILE), map_location="cpu").eval()
    return ImageClassifier(
        forward=module, preprocess=lambda crops: torch.stack([transform(crop) for crop in crops]), labels=labels
    )
