"""In-memory stand-ins for the ports a step's work goes through: object storage and the six models (the clients
of AWS's other services are moto's in the tests that need them). Each can be told to fail."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from shared.contracts import (
    AttributeScore,
    Box,
    BoxMask,
    CaptionOutput,
    ClassScore,
    Detection,
    MadeBy,
    VariantsRequest,
)
from shared.pipeline.dependencies import STEP_PORTS, Dependencies, Step
from shared.settings import ImageLimits
from shared.storage.objects import MemoryStore


@dataclass
class InMemoryStore(MemoryStore):
    """shared's in-memory store, counting reads, and told which writes fail."""

    failing_writes: tuple[str, ...] = ()  # URIs ending so fail to be written, as a full disk would
    reads: Counter[str] = field(default_factory=Counter)

    def read_bytes(self, uri: str, max_bytes: int | None = None) -> bytes:
        data = super().read_bytes(uri, max_bytes)
        self.reads[uri] += 1
        return data

    def write_bytes(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        if any(part in uri for part in self.failing_writes):
            raise OSError(f"no space left for {uri}")
        super().write_bytes(uri, data, content_type)


def _fail(failure: Exception | None) -> None:
    if failure is not None:
        raise failure


@dataclass
class FakeDetector:
    """Finds the boxes it was given, for the phrases the request names."""

    boxes: list[Detection]
    failure: Exception | None = None

    def detect(
        self, image: Image.Image, phrases: list[str], box_threshold: float, text_threshold: float
    ) -> list[Detection]:
        _fail(self.failure)
        return [box for box in self.boxes if box.label in phrases and box.score >= box_threshold]


@dataclass
class FakeClassifier:
    """Each crop is a 'kind of <label>'."""

    failure: Exception | None = None

    def classify(self, crops: list[Image.Image], box_labels: list[str], top_k: int) -> list[list[ClassScore]]:
        _fail(self.failure)
        return [[ClassScore(label=f"kind of {label}", score=0.9)] for label in box_labels]


@dataclass
class FakeTagger:
    """Each crop takes the first value of every vocabulary."""

    failure: Exception | None = None
    name: str = "fake-tagger"
    revision: str = "fake-revision"

    def tag(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> list[list[AttributeScore]]:
        _fail(self.failure)
        return [[AttributeScore(name=n, value=v[0], score=0.8) for n, v in vocabularies.items()] for _ in crops]

    def tag_and_embed(
        self, crops: list[Image.Image], box_labels: list[str], vocabularies: dict[str, list[str]]
    ) -> tuple[list[list[AttributeScore]], np.ndarray]:
        return self.tag(crops, box_labels, vocabularies), self.embed_images(crops)

    def choose(
        self, image: Image.Image, choices: Mapping[str, list[str]], independent: Collection[str] = ()
    ) -> dict[str, list[float]]:
        _fail(self.failure)
        return {name: [1.0 if index == 0 else 0.0 for index in range(len(texts))] for name, texts in choices.items()}

    def embed_images(self, images: list[Image.Image]) -> np.ndarray:
        """An image's mean colour and a constant, unit length: the same image, the same vector."""
        _fail(self.failure)
        rows = np.array([[*np.asarray(image.convert("RGB")).mean(axis=(0, 1)), 1.0] for image in images])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        rows = np.array([[len(text), 1.0, 1.0, 1.0] for text in texts])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


@dataclass
class FakeCaptioner:
    """Says what the facts found, in one line."""

    failure: Exception | None = None
    multimodal: bool = False

    def caption(
        self, facts: dict[str, Any], image: Image.Image | None = None, *, as_json: bool = False
    ) -> CaptionOutput:
        _fail(self.failure)
        found = ", ".join(f"{group['count']} {group['object']}" for group in facts["found"]) or "nothing"
        return CaptionOutput(
            caption=f"Found {found}.",
            model="fake-llm",
            ttft_ms=1.0,
            tokens_per_s=100.0,
            prompt_tokens=10,
            completion_tokens=3,
            peak_rss_mb=1.0,
        )

    def answer(self, image: Image.Image, question: str) -> str:
        """The picture's mean colour, and the question: another picture or question, another answer."""
        _fail(self.failure)
        red, green, blue = (round(value) for value in np.asarray(image.convert("RGB")).mean(axis=(0, 1)))
        return f"rgb({red},{green},{blue}) for {question}"


@dataclass
class FakeSegmenter:
    """Each box's mask is its rectangle, encoded as Segment encodes a real one (COCO RLE)."""

    failure: Exception | None = None
    name: str = "fake-segmenter"
    revision: str = "fake-revision"

    def segment(self, image: Image.Image, boxes: list[Box]) -> list[BoxMask | None]:
        from shared.models.segmentation import box_window
        from shared.storage.masks import encoded

        _fail(self.failure)
        masks: list[BoxMask | None] = []
        for box in boxes:
            x0, y0, x1, y1 = box_window(box, image.width, image.height)
            if x1 <= x0 or y1 <= y0:
                masks.append(None)
                continue
            mask = np.zeros((image.height, image.width), np.uint8, order="F")
            mask[y0:y1, x0:x1] = 1
            masks.append(encoded(mask, 0.9))
        return masks


@dataclass
class FakeGenerator:
    """Plain gray pictures of the requested size."""

    failure: Exception | None = None
    model_name: str = "fake-diffusion"

    def render(
        self, request: VariantsRequest, init_image: Image.Image | None, seed: int
    ) -> list[tuple[Image.Image, int, float]]:
        _fail(self.failure)
        picture = Image.new("RGB", (request.size, request.size), "gray")
        return [(picture, seed + index, 0.0) for index in range(request.count)]


@dataclass
class FakeModels:
    """The fakes of one test: each step's dependencies share the one store."""

    store: InMemoryStore = field(default_factory=InMemoryStore)
    detector: FakeDetector = field(default_factory=lambda: FakeDetector([]))
    classifier: FakeClassifier = field(default_factory=FakeClassifier)
    tagger: FakeTagger = field(default_factory=FakeTagger)
    segmenter: FakeSegmenter = field(default_factory=FakeSegmenter)
    captioner: FakeCaptioner = field(default_factory=FakeCaptioner)
    generator: FakeGenerator = field(default_factory=FakeGenerator)
    image_limits: ImageLimits = field(
        default_factory=lambda: ImageLimits(max_image_bytes=1_000_000, max_image_pixels=4_000_000)
    )
    store_pictures: bool = False

    def dependencies(self, step: Step) -> Dependencies:
        """As the real ones are built: the step's own port (STEP_PORTS) holds its fake; a step without a model gets
        none."""
        port = STEP_PORTS.get(step)
        own = {port.fills: getattr(self, port.fills)} if port else {}
        return Dependencies(
            store_for=self.store,
            image_limits=self.image_limits,
            store_pictures=self.store_pictures,
            made_by=MadeBy(model=f"fake-{step}", settings={"step": str(step)}),
            **own,
        )
