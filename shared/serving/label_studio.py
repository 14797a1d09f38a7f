"""Label Studio's terms: a project's label config read as what the models can fill in it, and what they found
written as the results Label Studio stores (the ML backend's predictions and the `labelstudio` export alike).

Any config is read by the same rules, Label Studio's own templates included. On its one ``Image`` (whatever its
value is called: ``$image``, ``$captioning``...):

- a ``RectangleLabels`` takes boxes: its labels are the prompt's phrases, and each box comes back under the label
  it was found for, spelled as the config spells it;
- a ``BrushLabels`` takes each box's mask, a ``PolygonLabels`` its mask's outline (Label Studio's two segmentation
  templates): their labels are phrases of the prompt too, and the request asks for masks;
- a per-region ``Choices`` named ``class`` takes each box's class; any other per-region ``Choices`` is an attribute
  whose choices are its vocabulary (CLIP, on the box);
- a whole-image ``Choices`` takes the choice CLIP finds likeliest for the whole image (``choice="multiple"``: each
  one likely enough);
- a ``TextArea`` takes the caption.

Everything else (unlabelled polygons and brushes, keypoints, transcriptions, controls on other objects) is left to
people and named; a config that leaves everything to people is refused in one line. A result names a choice or label
as Label Studio stores it: its ``alias`` where it has one, else its ``value``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import ValidationError

from shared.contracts import (
    MAX_ATTRIBUTE_VALUES,
    MAX_ATTRIBUTES,
    MAX_PHRASE_CHARS,
    MAX_PHRASES,
    MAX_PROMPT_CHARS,
    MAX_VALUE_CHARS,
    RESERVED_ATTRIBUTE_NAMES,
    AnnotationRequest,
    Box,
    BoxMask,
    phrase_of,
)
from shared.errors import RequestRejected, validation_reason

# The labelled region controls the models fill: boxes, and each box's mask or outline
REGION_TAGS = {"RectangleLabels": "box", "BrushLabels": "brush", "PolygonLabels": "polygon"}
MODEL_VERSION = "annotate"  # the predictions' model_version: Label Studio asks again only for tasks without one
CLASS_CONTROL = "class"  # the per-region Choices that takes each box's class (the export's name for it)
MAX_LABEL_CONFIG_CHARS = 100_000
UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-(?=.)")  # Label Studio names an upload "<8 hex>-<its original name>"
MAX_IMAGE_CHOICES = 200  # choices of one whole-image Choices: CLIP reads each one's text
# What the controls the models cannot fill ask for, as the refusals say it
UNFILLED = {
    "Polygon": "unlabelled polygons",
    "Brush": "unlabelled masks",
    "KeyPointLabels": "keypoints",
    "KeyPoint": "keypoints",
    "EllipseLabels": "ellipses",
    "Ellipse": "ellipses",
    "Rectangle": "unlabelled rectangles",
    "Labels": "labels of regions drawn by hand",
}
FILLED = "RectangleLabels (boxes), BrushLabels (masks), PolygonLabels (outlines), per-region Choices (class, "
FILLED += "attributes), Choices (the whole image) and a TextArea "
FILLED += "(the caption) on one Image, and with a vision-language model a TextArea answering a task's Text question"


@dataclass(frozen=True)
class LabelledBox:
    """A detected box with its class and attribute values, flat, as the exports, the gallery and Label Studio show
    it."""

    label: str
    score: float
    box: Box
    class_label: str | None
    class_score: float | None
    attributes: dict[str, str] = field(default_factory=dict)
    mask: BoxMask | None = None  # where its request asked for masks


@dataclass(frozen=True)
class Option:
    """A label or choice of the config: what the models read (``text``) and what Label Studio stores (``stored``)."""

    text: str
    stored: str


@dataclass(frozen=True)
class ImageChoices:
    """A whole-image Choices control."""

    name: str
    options: tuple[Option, ...]
    multiple: bool = False


@dataclass(frozen=True)
class Question:
    """A TextArea that answers a question a task holds (Label Studio's Visual Question Answering template): the
    TextArea, the Text object it answers, and the task data's key the question is under."""

    control: str
    text: str
    key: str


@dataclass(frozen=True)
class ShapeControl:
    """A BrushLabels (``brush``: each box's mask) or PolygonLabels (``polygon``: its outline) control, its labels."""

    name: str
    kind: str  # "brush" or "polygon"
    labels: tuple[Option, ...]

    def label_of(self, phrase: str) -> str | None:
        return next((label.stored for label in self.labels if phrase_of(label.text) == phrase_of(phrase)), None)


@dataclass(frozen=True)
class Project:
    """What a label config asks of the models, by its controls' names, and what it leaves to people."""

    image: str  # the Image object's name (the results' to_name)
    image_key: str  # the task data's key that holds the image ($image: image)
    boxes: str | None = None  # the RectangleLabels control
    labels: tuple[Option, ...] = ()
    region_choices: Mapping[str, tuple[Option, ...]] = field(default_factory=dict)  # per-region: name -> options
    image_choices: tuple[ImageChoices, ...] = ()
    caption: str | None = None  # the TextArea that takes the caption
    questions: tuple[Question, ...] = ()  # TextAreas the vision-language model answers, each about the picture
    shapes: tuple[ShapeControl, ...] = ()  # BrushLabels and PolygonLabels: each box's mask, or its outline
    left_to_people: tuple[str, ...] = ()  # each control the models do not fill, and why

    @property
    def attributes(self) -> dict[str, str]:
        """The attribute each per-region Choices (but the class) is tagged as, by name: control name -> attribute."""
        return {name: attribute_name(name) for name in self.region_choices if name != CLASS_CONTROL and self.boxes}

    @property
    def phrases(self) -> list[str]:
        """What the detector looks for: every region control's labels, as phrases, each once."""
        labels = [*self.labels, *(label for shape in self.shapes for label in shape.labels)]
        return list(dict.fromkeys(phrase_of(label.text) for label in labels))

    @property
    def runs_pipeline(self) -> bool:
        """Whether it needs the workflow's steps (boxes, masks, or a caption grounded in them), not CLIP on the image
        alone."""
        return self.boxes is not None or bool(self.shapes) or self.caption is not None

    def label_of(self, phrase: str) -> str | None:
        """The config's label for a box found for ``phrase`` (the first label that reads as it)."""
        return next((label.stored for label in self.labels if phrase_of(label.text) == phrase_of(phrase)), None)

    def request(self, default_prompt: str) -> AnnotationRequest:
        """The request that fills this config: its labels as the prompt (``default_prompt`` grounds a caption in a
        config without boxes), its attributes' vocabularies, a caption only where it has a place for one.

        Raises:
            RequestRejected: the labels make a prompt the models refuse.
        """
        vocabularies = {
            attribute: [option.text for option in self.region_choices[name]]
            for name, attribute in self.attributes.items()
        }
        regions = self.boxes or self.shapes
        prompt = " ".join(f"{phrase}." for phrase in self.phrases) if regions else default_prompt
        try:
            return AnnotationRequest(
                prompt=prompt, attributes=vocabularies, caption=self.caption is not None, masks=bool(self.shapes)
            )
        except ValidationError as error:
            raise RequestRejected(
                f"the label config asks what the models cannot give: {validation_reason(error)}"
            ) from None

    def fills(self) -> list[str]:
        """The controls the models fill, as a person reads them."""
        filled = [f"RectangleLabels {self.boxes!r}"] if self.boxes else []
        filled += [f"{'BrushLabels' if s.kind == 'brush' else 'PolygonLabels'} {s.name!r}" for s in self.shapes]
        filled += [f"Choices {name!r} (per box)" for name in self.region_choices if self.boxes]
        filled += [f"Choices {choices.name!r} (the image)" for choices in self.image_choices]
        filled += [f"TextArea {question.control!r} (answers Text {question.text!r})" for question in self.questions]
        return filled + ([f"TextArea {self.caption!r}"] if self.caption else [])


def attribute_name(control: str) -> str:
    """The attribute a per-region Choices is tagged as: its name, lower case, letters, digits and _ (what the tables'
    attribute names allow), never one of the exports' own names."""
    name = re.sub(r"[^a-z0-9_]+", "_", control.lower()).strip("_")[:32]
    if not name or not name[0].isalpha():
        name = f"a_{name}"[:32]
    return f"{name[:30]}_a" if name in RESERVED_ATTRIBUTE_NAMES else name


def original_name(location: str) -> str:
    """The file name a task's image had where it came from: Label Studio's uploads drop their ``<8 hex>-`` prefix,
    its local files are named by their ``d`` parameter; "" where there is no usable name."""
    if location.startswith("data:"):
        return ""
    parts = urlsplit(location)
    # Label Studio keeps an upload's name percent-encoded in its path (café.jpg as caf%C3%A9.jpg): the name is the
    # decoded one (a local file's ?d= is decoded by parse_qs already)
    path = (parse_qs(parts.query).get("d") or [unquote(parts.path)])[0]
    name = PurePosixPath(path).name
    if "/data/upload/" in parts.path:
        name = UPLOAD_PREFIX.sub("", name)
    return "" if name in ("", ".", "..") or not name.isprintable() else name


def read_label_config(config: str, sees_images: bool = False) -> Project:
    """What a Label Studio label config asks the models to fill, and what it leaves to people; ``sees_images``: the
    caption model is a vision-language model, which answers the questions a task holds about its picture.

    Raises:
        RequestRejected: not XML, not one Image, or nothing on it the models can fill (said in one line).
    """
    if len(config) > MAX_LABEL_CONFIG_CHARS:
        raise RequestRejected(f"the label config is {len(config):,} characters, over {MAX_LABEL_CONFIG_CHARS:,}")
    try:
        root = ElementTree.fromstring(config)
    except ElementTree.ParseError as error:
        raise RequestRejected(f"the label config is not XML: {error}") from None
    images = [element for element in root.iter("Image")]
    if len(images) != 1:
        shown = f"{len(images)} Image objects" if images else "no Image"
        raise RequestRejected(f"the label config has {shown}: the models fill {FILLED}")
    image = images[0]
    name, value = image.get("name", ""), image.get("value", "")
    if not value.startswith("$") or len(value) < 2:
        took = f"pages ({image.get('valueList')})" if image.get("valueList") else f"{value!r}, not $key"
        raise RequestRejected(f"the Image {name!r} takes {took}: the models fill one image a task")
    texts = {element.get("name", ""): element.get("value", "") for element in root.iter("Text")}
    reader = _ControlReader(name, texts, sees_images)
    for control in root.iter():
        if control.get("toName") is not None:
            reader.read(control)
    project = reader.project(name, value[1:])
    if not project.fills():
        left = "; ".join(project.left_to_people) or "no control"
        raise RequestRejected(f"the label config asks for nothing the models fill ({left}): they fill {FILLED}")
    return project


@dataclass
class _ControlReader:
    """Reads each control of a config in order, keeping those the models fill on ``image``."""

    image: str
    texts: Mapping[str, str] = field(default_factory=dict)  # each Text object's value, by name
    sees_images: bool = False
    boxes: str | None = None
    labels: tuple[Option, ...] = ()
    region_choices: dict[str, tuple[Option, ...]] = field(default_factory=dict)
    image_choices: list[ImageChoices] = field(default_factory=list)
    caption: str | None = None
    questions: list[Question] = field(default_factory=list)
    shapes: list[ShapeControl] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    named: set[str] = field(default_factory=set)

    def read(self, control: ElementTree.Element) -> None:
        name, tag = control.get("name", ""), control.tag
        targets = [target.strip() for target in control.get("toName", "").split(",")]
        per_region = control.get("perRegion", "").lower() == "true"
        why: str | None
        if tag == "TextArea" and name and name not in self.named and len(targets) == 1 and targets[0] in self.texts:
            why = self._question(name, targets[0])
        elif self.image not in targets:
            why = f"on {', '.join(repr(t) for t in targets)}, not the image"
        elif not name:
            why = "it has no name"
        elif name in self.named:
            why = "an earlier control has this name, and a result names its control"
        elif tag in REGION_TAGS:
            why = (
                self._boxes(control, name)
                if tag == "RectangleLabels"
                else self._shapes(control, name, REGION_TAGS[tag])
            )
        elif tag == "Choices":
            why = self._region_choices(control, name) if per_region else self._image_choices(control, name)
        elif tag == "TextArea" and per_region:
            why = "a text per region (a transcription) is not a caption"
        elif tag == "TextArea":
            why = "the caption has a TextArea already" if self.caption else None
            self.caption = self.caption or name
        else:
            why = f"the models draw no {UNFILLED.get(tag, tag)}"
        if why:
            self.left.append(f"{tag} {name!r}: {why}")
        self.named.add(name)

    def _question(self, name: str, text: str) -> str | None:
        if not self.sees_images:
            return "it answers a question about the picture: serve a vision-language model (--caption-vision)"
        value = self.texts[text]
        if not value.startswith("$") or len(value) < 2:
            return f"its question is the config's own text ({value[:40]!r}), not a task's"
        self.questions.append(Question(name, text, value[1:]))
        return None

    def _boxes(self, control: ElementTree.Element, name: str) -> str | None:
        if self.boxes:
            return f"the boxes go to RectangleLabels {self.boxes!r}"
        labels = _options(control, "Label")
        why = self._why_not_phrases(control, labels)
        if why is None:
            self.boxes, self.labels = name, labels
        return why

    def _shapes(self, control: ElementTree.Element, name: str, kind: str) -> str | None:
        taken = [shape.name for shape in self.shapes if shape.kind == kind]
        if taken:
            return f"the {'masks' if kind == 'brush' else 'outlines'} go to {taken[0]!r}"
        labels = _options(control, "Label")
        earlier = [*self.labels, *(label for shape in self.shapes for label in shape.labels)]
        why = self._why_not_phrases(control, (*earlier, *labels))
        if why is None:
            self.shapes.append(ShapeControl(name, kind, labels))
        return why

    @staticmethod
    def _why_not_phrases(control: ElementTree.Element, labels: tuple[Option, ...]) -> str | None:
        """Why the labels (with the other region controls') make no prompt, if they do not."""
        if control.get("value", "").startswith("$"):
            return f"its labels come from each task ({control.get('value')})"
        phrases = list(dict.fromkeys(phrase_of(label.text) for label in labels))
        if not phrases or not all(phrases):
            return "it has no label to look for" if not phrases else "a label reads as no phrase"
        if len(phrases) > MAX_PHRASES:
            return f"{len(phrases)} labels, the detector looks for at most {MAX_PHRASES}"
        if max(len(phrase) for phrase in phrases) > MAX_PHRASE_CHARS:
            return f"a label over {MAX_PHRASE_CHARS} characters"
        if sum(len(phrase) + 2 for phrase in phrases) > MAX_PROMPT_CHARS:
            return f"its labels make a prompt over {MAX_PROMPT_CHARS} characters"
        return None

    def _region_choices(self, control: ElementTree.Element, name: str) -> str | None:
        options = _options(control, "Choice")
        texts = [option.text for option in options]
        attribute = attribute_name(name)
        if not options:
            return "it has no choice"
        if name != CLASS_CONTROL:
            taken = [other for other in self.region_choices if attribute_name(other) == attribute]
            if taken:
                return f"it reads as the same attribute as {taken[0]!r}"
            if sum(1 for other in self.region_choices if other != CLASS_CONTROL) >= MAX_ATTRIBUTES:
                return f"the models tag at most {MAX_ATTRIBUTES} attributes a box"
            if len(options) > MAX_ATTRIBUTE_VALUES:
                return f"{len(options)} choices, the models tag from at most {MAX_ATTRIBUTE_VALUES}"
            if len(set(texts)) != len(texts) or max(len(text) for text in texts) > MAX_VALUE_CHARS:
                return f"its choices repeat, or one is over {MAX_VALUE_CHARS} characters"
        self.region_choices[name] = options
        return None

    def _image_choices(self, control: ElementTree.Element, name: str) -> str | None:
        options = _options(control, "Choice", read="hint")
        if control.get("value", "").startswith("$"):
            return f"its choices come from each task ({control.get('value')})"
        if not options:
            return "it has no choice"
        if len(options) > MAX_IMAGE_CHOICES:
            return f"{len(options)} choices, the models choose from at most {MAX_IMAGE_CHOICES}"
        self.image_choices.append(ImageChoices(name, options, control.get("choice", "single") == "multiple"))
        return None

    def project(self, image: str, image_key: str) -> Project:
        region_choices = self.region_choices
        if region_choices and not self.boxes:
            self.left += [
                f"Choices {name!r}: per region, and the models draw no region here" for name in region_choices
            ]
            region_choices = {}
        return Project(
            image=image,
            image_key=image_key,
            boxes=self.boxes,
            labels=self.labels,
            region_choices=region_choices,
            image_choices=tuple(self.image_choices),
            caption=self.caption,
            questions=tuple(self.questions),
            shapes=tuple(self.shapes),
            left_to_people=tuple(self.left),
        )


def _options(control: ElementTree.Element, tag: str, read: str = "value") -> tuple[Option, ...]:
    """The control's labels or choices that have a value: each read as its ``read`` attribute where it has one (a
    whole-image choice's hint says more to CLIP than its value), stored as its alias where it has one."""
    options = []
    for element in control.iter(tag):
        value = (element.get("value") or "").strip()
        if value:
            options.append(Option((element.get(read) or value).strip(), element.get("alias") or value))
    return tuple(options)
