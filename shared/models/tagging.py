"""Zero-shot attribute tagging of boxes with CLIP (an exported open_clip model on ONNX Runtime): 'a photo of a
brown dog' against the crop."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from shared.contracts import AttributeScore
from shared.errors import ModelUnavailable
from shared.models.cache import cached_per_settings
from shared.models.onnx_runtime import (
    as_rgb,
    center_crop,
    find_export,
    normalized,
    ort_session,
    resize_short_side,
    softmax,
)
from shared.observability import logger
from shared.settings import DescribeSettings, ModelFiles

PROMPT_TEMPLATE = "a photo of a {value} {label}"
IMAGE_PROMPT_TEMPLATE = "a photo of {value}"  # a whole image's choice: often not a noun ("Benign", "Adult content")
ANY_IMAGE_PROMPT = "a photo"  # what a choice that may hold with others is weighed against


class Tagger(Protocol):
    name: str
    revision: str

    def tag(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> list[list[AttributeScore]]: ...

    def tag_and_embed(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> tuple[list[list[AttributeScore]], np.ndarray]: ...

    def choose(
        self, image: Image.Image, choices: Mapping[str, list[str]], independent: Collection[str] = ()
    ) -> dict[str, list[float]]: ...

    def embed_images(self, images: list[Image.Image]) -> np.ndarray: ...

    def embed_texts(self, texts: list[str]) -> np.ndarray: ...


TAGGER_MANIFEST = "clip-export.json"
# What a cached export is keyed by, beyond the checkpoint: a manifest without its weights' revision is made again.
CLIP_EXPORT_VERSION = "with-revision"
IMAGE_GRAPH, TEXT_GRAPH, TOKENIZER_FILE = "clip-image.onnx", "clip-text.onnx", "tokenizer.json"


class ClipExport(BaseModel):
    """An exported open_clip model: its preprocessing, its tokenizer's framing and its logit scale."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    revision: str = Field(
        description="The weights' identity (tools/models/describe_export.py weights_revision): a vector is comparable"
        " only with vectors of the same model and revision"
    )
    image_size: int
    image_mean: list[float]
    image_std: list[float]
    context_length: int
    end_of_text_id: int
    logit_scale: float

    def preprocess(self, crops: list[Image.Image]) -> np.ndarray:
        """open_clip's transform: bicubic resize of the short side, center crop, normalize."""
        sized = [
            center_crop(resize_short_side(as_rgb(crop), self.image_size, Image.Resampling.BICUBIC), self.image_size)
            for crop in crops
        ]
        return normalized(sized, self.image_mean, self.image_std)

    def tokens(self, tokenizer: Any, texts: list[str]) -> np.ndarray:
        """open_clip's token rows: start, text, end, zeros; a text too long keeps its end token."""
        rows = np.zeros((len(texts), self.context_length), np.int64)
        for row, encoding in zip(rows, tokenizer.encode_batch(texts), strict=True):
            ids = encoding.ids
            if len(ids) > self.context_length:
                ids = [*ids[: self.context_length - 1], self.end_of_text_id]
            row[: len(ids)] = ids
        return rows


@dataclass
class ClipTagger:
    """CLIP image and text towers; text embeddings are cached per (vocabulary, label) for the process."""

    name: str
    revision: str  # the weights' identity (ClipExport.revision), which every embedding names beside the model
    encode_image: Callable[[list[Image.Image]], np.ndarray]  # crops -> features
    encode_text: Callable[[list[str]], np.ndarray]  # texts -> features
    logit_scale: float
    cache_size: int = 4096
    passed_over: list[str] = field(default_factory=list)  # models tried first that did not load, with why
    text_encodings: int = 0  # how many vocabularies were encoded (not served from the cache)
    _text_cache: OrderedDict[tuple[str, ...], np.ndarray] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tag(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> list[list[AttributeScore]]:
        """Per crop, the best value of each attribute, in one image forward for all crops."""
        if not (crops and vocabularies):
            return [[] for _ in crops]
        return self._tags(_unit(self.encode_image(crops)), box_labels, vocabularies)

    def tag_and_embed(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> tuple[list[list[AttributeScore]], np.ndarray]:
        """:meth:`tag`'s answer and the crops' embeddings (as :meth:`embed_images` gives them), from the one image
        forward: the tags are what :meth:`tag` alone finds."""
        images = _unit(self.encode_image(crops))
        tags = self._tags(images, box_labels, vocabularies) if vocabularies else [[] for _ in crops]
        return tags, images.astype(np.float32)

    def _tags(
        self, images: np.ndarray, box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> list[list[AttributeScore]]:
        results = []
        for image, label in zip(images, box_labels, strict=True):
            scores = []
            for name, values in vocabularies.items():
                texts = [PROMPT_TEMPLATE.format(value=value, label=label) for value in values]
                probabilities = softmax(self.logit_scale * self._text_embeddings(texts) @ image)
                best = int(probabilities.argmax())
                scores.append(AttributeScore(name=name, value=values[best], score=round(float(probabilities[best]), 4)))
            results.append(scores)
        return results

    def choose(
        self, image: Image.Image, choices: Mapping[str, list[str]], independent: Collection[str] = ()
    ) -> dict[str, list[float]]:
        """Per named list of choices, each one's probability for the whole image (CLIP zero-shot: one image
        forward, the softmax over the list's texts). A list named in ``independent`` (several may be true) scores
        each text on its own: the softmax of it against a photo of anything, so that five true choices are not
        five fifths."""
        if not choices:
            return {}
        features = _unit(self.encode_image([image]))[0]
        chosen: dict[str, list[float]] = {}
        for name, texts in choices.items():
            similarity = self._text_embeddings([IMAGE_PROMPT_TEMPLATE.format(value=text) for text in texts]) @ features
            if name in independent:
                anything = float(self._text_embeddings([ANY_IMAGE_PROMPT])[0] @ features)
                probabilities = [softmax(self.logit_scale * np.array([s, anything]))[0] for s in similarity]
            else:
                probabilities = list(softmax(self.logit_scale * similarity))
            chosen[name] = [round(float(p), 4) for p in probabilities]
        return chosen

    def embed_images(self, images: list[Image.Image]) -> np.ndarray:
        """Each image's embedding (the image tower on the whole image, as open_clip preprocesses it), unit length,
        float32: what the embeddings table keeps and annotate search compares."""
        return _unit(self.encode_image(images)).astype(np.float32)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Each text's embedding (the text tower on the text as written, no prompt template), unit length, float32:
        a search's query, in the images' space."""
        return _unit(self.encode_text(texts)).astype(np.float32)

    def _text_embeddings(self, texts: list[str]) -> np.ndarray:
        key = tuple(texts)
        with self._lock:
            if key in self._text_cache:
                self._text_cache.move_to_end(key)
                return self._text_cache[key]
        text = _unit(self.encode_text(texts))
        with self._lock:
            self.text_encodings += 1
            self._text_cache[key] = text
            while len(self._text_cache) > self.cache_size:
                self._text_cache.popitem(last=False)
        return text


def _unit(features: np.ndarray) -> np.ndarray:
    features = features.astype(np.float64)
    return features / np.linalg.norm(features, axis=-1, keepdims=True)


@cached_per_settings
def load_tagger(settings: DescribeSettings) -> ClipTagger:
    """The first of the settings' CLIP models whose export loads, on ONNX Runtime; each one passed over is logged
    as a warning.

    Raises:
        ModelUnavailable: none of them could be loaded.
    """
    reasons = []
    for source in settings.tagger_models or []:
        try:
            tagger = _exported_tagger(source, settings)
        except (ModelUnavailable, RuntimeError, OSError, ValueError) as error:
            reasons.append(f"{source}: {error}")
            logger.warning("tagger model unavailable, trying the next", extra={"model": source, "error": str(error)})
            continue
        tagger.passed_over = reasons
        logger.info("tagger loaded", extra={"model": source, "passed_over": len(reasons)})
        return tagger
    raise ModelUnavailable("no tagger model could be loaded: " + " | ".join(reasons))


def clip_export_dir(source: str, files: ModelFiles) -> Path:
    """The export folder of the open_clip model ``source`` (:func:`find_export`)."""
    return find_export(source, files, TAGGER_MANIFEST, CLIP_EXPORT_VERSION)


def _exported_tagger(source: str, settings: DescribeSettings) -> ClipTagger:
    from tokenizers import Tokenizer

    folder = clip_export_dir(source, settings)
    export = ClipExport.model_validate_json((folder / TAGGER_MANIFEST).read_text())
    image_session = ort_session(folder / IMAGE_GRAPH, settings.torch_threads)
    text_session = ort_session(folder / TEXT_GRAPH, settings.torch_threads)
    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    return ClipTagger(
        source,
        revision=export.revision,
        encode_image=lambda crops: image_session.run(None, {"pixels": export.preprocess(crops)})[0],
        encode_text=lambda texts: text_session.run(None, {"tokens": export.tokens(tokenizer, texts)})[0],
        logit_scale=export.logit_scale,
        cache_size=settings.text_cache_size,
    )
