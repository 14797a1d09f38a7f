"""Label Studio's terms: a project's label config read as the request it asks of the models, and boxes written as
the regions Label Studio shows (the ML backend's predictions and the `labelstudio` export alike).

The config's controls name everything: the ``RectangleLabels`` on the image hold the prompt's phrases as labels; a
per-region ``Choices`` named ``class`` takes each box's class, and every other per-region ``Choices`` is an
attribute whose choices are its vocabulary; a ``TextArea`` (or ``Text``) takes the caption. Results use the
controls' names as the config gives them (``from_name``, ``to_name``), geometry in percent of the image.
"""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.contracts import MAX_PROMPT_CHARS, AnnotationRequest
from shared.errors import RequestRejected

CLASS_CONTROL = "class"  # the per-region Choices that takes each box's class (the export's name for it)
MAX_LABEL_CONFIG_CHARS = 100_000


@dataclass(frozen=True)
class LabelledBox:
    """A detected box with its class and attribute values, flat, as the exports, the gallery and Label Studio show
    it."""

    label: str
    score: float
    x0: float
    y0: float
    x1: float
    y1: float
    class_label: str | None
    class_score: float | None
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Project:
    """What a label config asks of the models, by its controls' names."""

    image: str  # the Image object's name (the results' to_name)
    image_key: str  # the task data's key that holds the image ($image: image)
    boxes: str  # the RectangleLabels control
    labels: tuple[str, ...]
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per-region Choices: name -> its choices
    caption: str | None = None  # the TextArea that takes the caption

    @property
    def attributes(self) -> dict[str, list[str]]:
        return {name: list(values) for name, values in self.choices.items() if name != CLASS_CONTROL}

    def request(self) -> AnnotationRequest:
        """The request that fills this config: its labels as the prompt, its attributes' vocabularies, a caption
        only where it has a place for one.

        Raises:
            RequestRejected: the labels make a prompt the models refuse (too long, a name an export uses).
        """
        try:
            return AnnotationRequest(
                prompt=" ".join(f"{label}." for label in self.labels),
                attributes=self.attributes,
                caption=self.caption is not None,
            )
        except ValueError as error:
            raise RequestRejected(f"the label config asks what the models cannot give: {error}") from None


def read_label_config(config: str) -> Project:
    """The project a Label Studio label config describes.

    Raises:
        RequestRejected: not XML, no Image, no RectangleLabels on it with a label, or a control the models cannot
            fill (a per-region Choices on another object, a control type they have no output for).
    """
    if len(config) > MAX_LABEL_CONFIG_CHARS:
        raise RequestRejected(f"the label config is {len(config):,} characters, over {MAX_LABEL_CONFIG_CHARS:,}")
    try:
        root = ElementTree.fromstring(config)
    except ElementTree.ParseError as error:
        raise RequestRejected(f"the label config is not XML: {error}") from None
    images = [element for element in root.iter("Image") if element.get("name")]
    if len(images) != 1:
        raise RequestRejected(f"the label config has {len(images)} Image objects: the models label exactly one")
    image = images[0]
    name, value = image.get("name", ""), image.get("value", "")
    if not value.startswith("$"):
        raise RequestRejected(f"the Image {name!r} takes no task data (its value is {value!r}, not $key)")
    boxes = [c for c in root.iter("RectangleLabels") if c.get("toName") == name]
    if len(boxes) != 1:
        raise RequestRejected(f"the label config has {len(boxes)} RectangleLabels on {name!r}: the models fill one")
    labels = tuple(label.get("value", "") for label in boxes[0].iter("Label") if label.get("value"))
    if not labels:
        raise RequestRejected("the RectangleLabels control has no Label: its labels are the prompt's phrases")
    if sum(len(label) + 2 for label in labels) > MAX_PROMPT_CHARS:
        raise RequestRejected(f"the labels make a prompt over {MAX_PROMPT_CHARS} characters")
    choices = _region_choices(root, name)
    unfillable = [c.tag for c in root.iter() if c.tag in UNFILLABLE and c.get("toName") == name]
    if unfillable:
        raise RequestRejected(f"the label config asks for {', '.join(sorted(set(unfillable)))}: the models give boxes")
    areas = [c.get("name", "") for c in root.iter("TextArea") if c.get("toName")]
    return Project(
        image=name,
        image_key=value[1:],
        boxes=boxes[0].get("name", ""),
        labels=labels,
        choices=choices,
        caption=areas[0] if areas else None,
    )


def _region_choices(root: ElementTree.Element, image: str) -> dict[str, tuple[str, ...]]:
    """Each per-region Choices control: its name and its choices.

    Raises:
        RequestRejected: one is on another object than the image.
    """
    choices: dict[str, tuple[str, ...]] = {}
    for control in root.iter("Choices"):
        if control.get("perRegion", "").lower() != "true":
            continue  # a choice about the whole task: not the models' to make
        if control.get("toName") != image:
            raise RequestRejected(f"the per-region Choices {control.get('name')!r} is not on the Image {image!r}")
        values = tuple(choice.get("value", "") for choice in control.iter("Choice") if choice.get("value"))
        if control.get("name") and values:
            choices[control.get("name", "")] = values
    return choices


# Controls on the image the models have no output for
UNFILLABLE = frozenset({"PolygonLabels", "BrushLabels", "KeyPointLabels", "EllipseLabels", "Polygon", "Brush"})


def region_results(
    boxes: Iterable[LabelledBox], width: int, height: int, project: Project, region_key: str
) -> list[dict[str, Any]]:
    """Each box as a region of ``project``'s box control, with its class and attributes as per-region choices where
    the config has that control and that choice (Label Studio shows no other); ``region_key`` makes the regions'
    ids stable for the same image."""
    results: list[dict[str, Any]] = []
    for box in boxes:
        region = uuid.uuid5(uuid.NAMESPACE_URL, f"{region_key}/{box}").hex[:10]
        common = {
            "id": region,
            "to_name": project.image,
            "original_width": width,
            "original_height": height,
            "image_rotation": 0,
        }
        geometry = {
            "x": 100 * box.x0 / width,
            "y": 100 * box.y0 / height,
            "width": 100 * (box.x1 - box.x0) / width,
            "height": 100 * (box.y1 - box.y0) / height,
            "rotation": 0,
        }
        results.append(
            {
                **common,
                "from_name": project.boxes,
                "type": "rectanglelabels",
                "value": {**geometry, "rectanglelabels": [box.label]},
                "score": box.score,
            }
        )
        for name, value in ({CLASS_CONTROL: box.class_label} | box.attributes).items():
            if value and value in project.choices.get(name, ()):
                results.append(
                    {**common, "from_name": name, "type": "choices", "value": {**geometry, "choices": [value]}}
                )
    return results


def caption_result(caption: str, project: Project) -> list[dict[str, Any]]:
    """The caption in the project's TextArea, when it has one."""
    if not (caption and project.caption):
        return []
    return [
        {
            "id": uuid.uuid5(uuid.NAMESPACE_URL, caption).hex[:10],
            "from_name": project.caption,
            "to_name": project.image,
            "type": "textarea",
            "value": {"text": [caption]},
        }
    ]


def label_config(project: Project) -> str:
    """The label config that declares ``project``'s controls (what `annotate export --format labelstudio` writes
    beside its tasks, and what the backend reads back as the same project)."""
    from xml.sax.saxutils import quoteattr

    lines = ["<View>", f"  <Image name={quoteattr(project.image)} value={quoteattr('$' + project.image_key)}/>"]
    lines.append(f"  <RectangleLabels name={quoteattr(project.boxes)} toName={quoteattr(project.image)}>")
    lines += [f"    <Label value={quoteattr(label)}/>" for label in project.labels]
    lines.append("  </RectangleLabels>")
    for name, values in project.choices.items():
        lines.append(f'  <Choices name={quoteattr(name)} toName={quoteattr(project.image)} perRegion="true">')
        lines += [f"    <Choice value={quoteattr(value)}/>" for value in values]
        lines.append("  </Choices>")
    if project.caption:
        lines.append(f"  <TextArea name={quoteattr(project.caption)} toName={quoteattr(project.image)}/>")
    return "\n".join([*lines, "</View>"]) + "\n"
