"""Zero-shot attribute tagging of boxes with open_clip: 'a photo of a brown dog' against the crop."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from PIL import Image

from shared.contracts import AttributeScore
from shared.errors import ModelUnavailable
from shared.model_cache import cached_per_settings
from shared.model_sources import prepare_torch, resolve_model_dir
from shared.observability import logger
from shared.settings import DescriptionSettings

PROMPT_TEMPLATE = "a photo of a {value} {label}"


class Tagger(Protocol):
    name: str

    def tag(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> list[list[AttributeScore]]: ...


@dataclass
class ClipTagger:
    """open_clip image and text towers; text embeddings are cached per (vocabulary, label) for the process."""

    name: str
    model: Any
    preprocess: Any
    tokenizer: Any
    cache_size: int = 4096
    encode_image: Any = None  # the image tower; the model's own unless ONNX Runtime serves it
    passed_over: list[str] = field(default_factory=list)  # models tried first that did not load, with why
    text_encodings: int = 0  # how many vocabularies were encoded (not served from the cache)
    _text_cache: OrderedDict[tuple[str, tuple[str, ...], str], Any] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tag(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> list[list[AttributeScore]]:
        """Per crop, the best value of each attribute, in one image forward for all crops."""
        import torch

        if not crops:
            return []
        with torch.inference_mode():
            pixels = torch.stack([self.preprocess(crop) for crop in crops])
            images = (self.encode_image or self.model.encode_image)(pixels).float()
            images = images / images.norm(dim=-1, keepdim=True)
            scale = float(self.model.logit_scale.exp()) if hasattr(self.model, "logit_scale") else 100.0
        results = []
        for image, label in zip(images, box_labels, strict=True):
            scores = []
            for name, values in vocabularies.items():
                probabilities = (scale * image @ self._text_embeddings(name, values, label).T).softmax(dim=-1)
                best = int(probabilities.argmax())
                scores.append(AttributeScore(name=name, value=values[best], score=round(float(probabilities[best]), 4)))
            results.append(scores)
        return results

    def _text_embeddings(self, name: str, values: list[str], label: str) -> Any:
        import torch

        key = (name, tuple(values), label)
        with self._lock:
            if key in self._text_cache:
                self._text_cache.move_to_end(key)
                return self._text_cache[key]
        with torch.inference_mode():
            tokens = self.tokenizer([PROMPT_TEMPLATE.format(value=value, label=label) for value in values])
            text = self.model.encode_text(tokens).float()
            text = text / text.norm(dim=-1, keepdim=True)
        with self._lock:
            self.text_encodings += 1
            self._text_cache[key] = text
            while len(self._text_cache) > self.cache_size:
                self._text_cache.popitem(last=False)
        return text


def _onnx_image_tower(model: Any, source: str, settings: DescriptionSettings) -> Any:
    import torch

    from shared.onnx_runtime import export_once, onnx_file, session_forward

    class ImageTower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.model.encode_image(pixels)

    size = model.visual.image_size
    size = size if isinstance(size, tuple | list) else (size, size)
    path = onnx_file(settings, source, "clip-image")
    export_once(ImageTower(), torch.rand(1, 3, *size), path, "pixels", "features")
    return session_forward(path, settings.torch_threads)


@cached_per_settings
def load_tagger(settings: DescriptionSettings) -> ClipTagger:
    """The first of the settings' open_clip models that loads; each one passed over is logged as a warning.

    Raises:
        ModelUnavailable: none of them could be loaded.
    """
    import open_clip

    prepare_torch(settings.torch_threads)
    reasons = []
    for source in settings.tagger_models or []:
        try:
            folder = resolve_model_dir(source, settings)
            model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")
            tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
        except (ModelUnavailable, RuntimeError, OSError, ValueError) as error:
            reasons.append(f"{source}: {error}")
            logger.warning("tagger model unavailable, trying the next", extra={"model": source, "error": str(error)})
            continue
        logger.info("tagger loaded", extra={"model": source, "passed_over": len(reasons)})
        tagger = ClipTagger(
            source, model.eval(), preprocess, tokenizer, cache_size=settings.text_cache_size, passed_over=reasons
        )
        if settings.describe_runtime == "onnx":
            tagger.encode_image = _onnx_image_tower(model, source, settings)
        return tagger
    raise ModelUnavailable("no tagger model could be loaded: " + " | ".join(reasons))
