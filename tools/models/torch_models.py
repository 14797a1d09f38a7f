"""The models on torch, as their checkpoints run them: what the ONNX exports are made from and tested against,
and the torch side of `annotate bench`. Never in a Lambda function (shared/ runs the exports, without torch).

Each loader returns the runtime's own types (Detector, ImageClassifier, ClipTagger), so that one post-processing
serves both sides and a comparison compares the models alone.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from shared.contracts import Detection
from shared.errors import ModelUnavailable
from shared.models.cache import cached_per_settings
from shared.models.classification import LABELS_FILE, TORCHSCRIPT_FILE, ImageClassifier
from shared.models.detection import phrase_detections, phrase_spans
from shared.models.onnx_runtime import cached_export_dir
from shared.models.sources import resolve_model_dir
from shared.models.tagging import ClipTagger
from shared.observability import logger
from shared.settings import DescribeSettings, DetectionSettings, ModelFiles


def prepare_torch(threads: int) -> None:
    """Process-wide torch and transformers set-up that every torch loader needs: threads, quiet loading."""
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@dataclass
class TorchGroundingDino:
    """Grounding DINO in torch eager, with the model card's processor, and the project's post-processing."""

    model: Any
    processor: Any
    short_side: int
    max_detections: int
    nms_iou: float
    bf16: bool = False

    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]:
        import torch

        inputs = self.processor(
            images=image,
            text=". ".join(phrases) + ".",
            return_tensors="pt",
            size={"shortest_edge": self.short_side, "longest_edge": self.short_side * 1333 // 800},
        )
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            outputs = self.model(**inputs)
        return phrase_detections(
            outputs.logits[0].float().numpy(),
            outputs.pred_boxes[0].float().numpy(),
            phrase_spans(phrases, lambda phrase: len(self.processor.tokenizer.tokenize(phrase))),
            phrases,
            (image.width, image.height),
            min_score=max(box_threshold, text_threshold),
            nms_iou=self.nms_iou,
            max_detections=self.max_detections,
        )


@cached_per_settings
def load_torch_detector(settings: DetectionSettings) -> TorchGroundingDino:
    """The detector's checkpoint in torch eager, fp32 (``dataclasses.replace(..., bf16=True)`` for autocast)."""
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    prepare_torch(settings.torch_threads)
    folder = resolve_model_dir(settings.detector_model, settings)
    return TorchGroundingDino(
        AutoModelForZeroShotObjectDetection.from_pretrained(folder).eval(),
        AutoProcessor.from_pretrained(folder),
        settings.detection_short_side,
        settings.max_detections,
        settings.nms_iou,
    )


@cached_per_settings
def load_torch_classifier(settings: DescribeSettings) -> ImageClassifier:
    """A transformers image classifier, or a traced TorchScript model with its labels, on torch."""
    prepare_torch(settings.torch_threads)
    folder = resolve_model_dir(settings.classifier_model, settings)
    loaded = torchscript_classifier(folder) if (folder / TORCHSCRIPT_FILE).is_file() else _transformers(folder)
    return ImageClassifier(forward=loaded[0], labels=loaded[1], class_filter=dict(settings.class_filter or {}))


def _transformers(folder: Path) -> tuple[Any, list[str]]:
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    processor = AutoImageProcessor.from_pretrained(folder)

    def forward(crops: list[Image.Image]) -> np.ndarray:
        with torch.inference_mode():
            return model(pixel_values=processor(images=crops, return_tensors="pt")["pixel_values"]).logits.numpy()

    return forward, [model.config.id2label[i] for i in range(model.config.num_labels)]


def torchscript_classifier(folder: Path) -> tuple[Any, list[str]]:
    """A traced model (``torchscript.pt``), its class names (``labels.txt``, one a line) and, optionally,
    ``preprocess.json`` ({"size": 224, "mean": [...], "std": [...]}; ImageNet's by default)."""
    import torch
    from torchvision.transforms import v2

    labels = torchscript_labels(folder)
    options = torchscript_preprocessing(folder)
    transform = v2.Compose(
        [
            v2.PILToTensor(),
            v2.Resize((options["size"], options["size"]), antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(options["mean"], options["std"]),
        ]
    )
    module = torch.jit.load(str(folder / TORCHSCRIPT_FILE), map_location="cpu").eval()

    def forward(crops: list[Image.Image]) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.stack([transform(crop.convert("RGB")) for crop in crops])).numpy()

    return forward, labels


def torchscript_labels(folder: Path) -> list[str]:
    """The class names beside a traced classifier.

    Raises:
        ModelUnavailable: ``labels.txt`` is missing.
    """
    labels_path = folder / LABELS_FILE
    if not labels_path.is_file():
        raise ModelUnavailable(f"{folder / TORCHSCRIPT_FILE} needs its class names in {labels_path}")
    return [line.strip() for line in labels_path.read_text(encoding="utf-8").splitlines() if line.strip()]


def torchscript_preprocessing(folder: Path) -> dict[str, Any]:
    options: dict[str, Any] = {"size": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    if (folder / "preprocess.json").is_file():
        options |= json.loads((folder / "preprocess.json").read_text())
    return options


@cached_per_settings
def load_torch_tagger(settings: DescribeSettings) -> ClipTagger:
    """The settings' first open_clip model on torch, with open_clip's preprocessing and tokenizer."""
    import open_clip
    import torch

    prepare_torch(settings.torch_threads)
    source = (settings.tagger_models or [""])[0]
    folder = resolve_model_dir(source, settings)
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    model = model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")

    def encode_image(crops: list[Image.Image]) -> np.ndarray:
        with torch.inference_mode():
            return model.encode_image(torch.stack([preprocess(crop) for crop in crops])).float().numpy()

    def encode_text(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return model.encode_text(tokenizer(texts)).float().numpy()

    return ClipTagger(source, weights_revision(model), encode_image, encode_text, float(model.logit_scale.exp()))


def weights_revision(model: Any) -> str:
    """A torch model's weights' identity: the first 16 hex digits of the SHA-256 over each tensor's name, type, shape
    and bytes, in name order. Two exports of one checkpoint share it, wherever they were made; other weights under
    the same name (a checkpoint trained further, pushed again) do not."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


_announced: list[float] = []  # when the exports under way started


def _announce_exports() -> None:
    """One line, as the exports start: a newcomer's first run spends seconds here, once."""
    if not _announced:
        _announced.append(time.monotonic())
        print(
            "exporting the models to ONNX for this machine, once (the tiny profile's take about 20 s; later runs"
            " reuse them)",
            file=sys.stderr,
            flush=True,
        )


def exports_finished() -> float | None:
    """The seconds the exports since the announcement took (None if there were none); the next export announces
    itself again."""
    return time.monotonic() - _announced.pop() if _announced else None


@contextmanager
def _known_export_warnings_quiet() -> Iterator[None]:
    """The warnings every export of these models gives, each known to be harmless here: tracing freezes a shape
    check (each export is for one size); a model's scalar read off a parameter; opset 17's advanced indexing; a strided
    slice left unfolded. The exports are checked against torch by tests instead."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True", category=UserWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
        # EdgeTAM's graph slices with a step above 1: the exporter leaves that Slice for the runtime to compute
        warnings.filterwarnings("ignore", message="Constant folding - Only steps=1", category=UserWarning)
        yield


def export_once(
    source: str, files: ModelFiles, manifest: str, export: Callable[[Path, Path], None], extra: object = None
) -> Path:
    """The ONNX export of the model ``source`` names: the source itself when it is an export, else this machine's
    cached one (shared/models/onnx_runtime.py finds it by the same key), which ``export(checkpoint, folder)`` makes the
    first time; the folder appears whole or not at all."""
    folder = resolve_model_dir(source, files)
    if (folder / manifest).is_file():
        return folder
    target = cached_export_dir(source, folder, files, manifest, extra)
    if not (target / manifest).is_file():
        # a staging folder of its own: two processes (two test workers) may export the same model at once
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-"))
        prepare_torch(0)
        _announce_exports()
        try:
            with _known_export_warnings_quiet():
                export(folder, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # a failed export leaves nothing behind
            raise
        if (target / manifest).is_file():  # the other process finished first: its export is the same
            shutil.rmtree(staging, ignore_errors=True)
            return target
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        logger.info("exported to ONNX", extra={"model": source, "folder": str(target)})
    return target
