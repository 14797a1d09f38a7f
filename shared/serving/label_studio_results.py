"""Label Studio's results, in a project's own names: the regions, the whole image's choices, the answers, the
caption, as one prediction; and the label config an export writes (shared/serving/label_studio.py reads configs)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from shared.serving.label_studio import (
    CLASS_CONTROL,
    MODEL_VERSION,
    LabelledBox,
    Option,
    Project,
    Question,
    ShapeControl,
)
from shared.storage.masks import label_studio_brush, outlines


def _region_id(region_key: str, box: LabelledBox, kind: str = "") -> str:
    """A region's id, the same for the same box of the same image (its mask aside); a mask or outline is a region
    of its own (``kind``): Label Studio takes results that share an id for one region."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"{region_key}/{replace(box, mask=None)}{kind}").hex[:10]


def region_results(
    boxes: Iterable[LabelledBox], width: int, height: int, project: Project, region_key: str
) -> list[dict[str, Any]]:
    """Each box as a region of ``project``'s box control, under the config's label for its phrase (a box of a
    phrase the config does not list is left out), with its class and attributes as per-region choices where the
    config has that control and that choice, and its mask as a region of each BrushLabels or PolygonLabels control;
    ``region_key`` makes the regions' ids stable for the same image."""
    boxes = list(boxes)
    shapes = [
        result
        for box in boxes
        if box.mask is not None
        for shape in project.shapes
        for result in _shape_result(shape, box, width, height, project.image, region_key)
    ]
    if not project.boxes:
        return shapes
    controls = {CLASS_CONTROL: CLASS_CONTROL} if CLASS_CONTROL in project.region_choices else {}
    controls |= {attribute: name for name, attribute in project.attributes.items()}
    results: list[dict[str, Any]] = []
    for box in boxes:
        label = project.label_of(box.label)
        if label is None:
            continue
        common = {
            "id": _region_id(region_key, box),
            "to_name": project.image,
            "original_width": width,
            "original_height": height,
            "image_rotation": 0,
        }
        geometry = {
            "x": 100 * box.box.x0 / width,
            "y": 100 * box.box.y0 / height,
            "width": 100 * (box.box.x1 - box.box.x0) / width,
            "height": 100 * (box.box.y1 - box.box.y0) / height,
            "rotation": 0,
        }
        results.append(
            {
                **common,
                "from_name": project.boxes,
                "type": "rectanglelabels",
                "value": {**geometry, "rectanglelabels": [label]},
                "score": box.score,
            }
        )
        for attribute, value in ({CLASS_CONTROL: box.class_label} | box.attributes).items():
            control = controls.get(attribute)
            stored = _stored(project.region_choices.get(control or "", ()), value)
            if control and stored:
                results.append(
                    {**common, "from_name": control, "type": "choices", "value": {**geometry, "choices": [stored]}}
                )
    return results + shapes


def _shape_result(
    shape: ShapeControl, box: LabelledBox, width: int, height: int, image: str, region_key: str
) -> list[dict[str, Any]]:
    """The box's mask as Label Studio stores a brush region (its RLE), or its largest outline as a polygon (points
    in percent of the image); none for a phrase the control does not list, or a mask with no pixel."""
    label = shape.label_of(box.label)
    if label is None or box.mask is None or not box.mask.area:
        return []
    if shape.kind == "brush":
        value: dict[str, Any] = {"format": "rle", "rle": label_studio_brush(box.mask), "brushlabels": [label]}
    else:
        outline = outlines(box.mask)[0]
        points = [[100 * x / width, 100 * y / height] for x, y in outline]
        value = {"points": points, "closed": True, "polygonlabels": [label]}
    return [
        {
            "id": _region_id(region_key, box, shape.kind),
            "from_name": shape.name,
            "to_name": image,
            "type": f"{shape.kind}labels",
            "original_width": width,
            "original_height": height,
            "image_rotation": 0,
            "value": value,
            "score": box.mask.score,
        }
    ]


def _stored(options: Iterable[Option], text: str | None) -> str | None:
    return next((option.stored for option in options if option.text == text), None)


def image_choice_results(
    project: Project, scores: Mapping[str, list[float]], min_score: float, region_key: str
) -> list[dict[str, Any]]:
    """Each whole-image Choices' choice: the likeliest of ``scores`` (by control: one probability per option), or,
    where the control takes several, every one scoring ``min_score`` or more on its own (each option's probability
    then stands alone: :meth:`Tagger.choose`'s ``independent``); a control none is likely enough for gets none."""
    results = []
    for control in project.image_choices:
        probabilities = scores.get(control.name)
        if not probabilities:
            continue
        ranked = sorted(zip(probabilities, control.options, strict=True), key=lambda pair: -pair[0])
        chosen = [pair for pair in ranked if pair[0] >= min_score] if control.multiple else ranked[:1]
        if not chosen:
            continue
        results.append(
            {
                "id": uuid.uuid5(uuid.NAMESPACE_URL, f"{region_key}/{control.name}").hex[:10],
                "from_name": control.name,
                "to_name": project.image,
                "type": "choices",
                "value": {"choices": [option.stored for _, option in chosen]},
                "score": round(min(score for score, _ in chosen), 4),
            }
        )
    return results


def prediction(
    project: Project,
    region_key: str,
    size: tuple[int, int],
    boxes: list[LabelledBox],
    caption: str | None,
    whole_image: list[dict[str, Any]],
) -> dict[str, Any]:
    """One of Label Studio's predictions: the regions in the config's names, the caption, the whole image's
    results (its choices, the answers to its questions); a score per region and the lowest for the prediction."""
    result = region_results(boxes, size[0] or 1, size[1] or 1, project, region_key)
    result += caption_result(caption or "", project) + whole_image
    scores = [item["score"] for item in result if "score" in item]
    # an empty prediction is no claim of full confidence: it sorts first among the tasks to review
    return {"result": result, "score": min(scores, default=1.0 if result else 0.0), "model_version": MODEL_VERSION}


def answer_result(question: Question, answer: str, region_key: str) -> dict[str, Any]:
    """An answer in the question's TextArea."""
    return {
        "id": uuid.uuid5(uuid.NAMESPACE_URL, f"{region_key}/{question.control}").hex[:10],
        "from_name": question.control,
        "to_name": question.text,
        "type": "textarea",
        "value": {"text": [answer]},
    }


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

    def option(tag: str, value: Option) -> str:
        alias = f" alias={quoteattr(value.stored)}" if value.stored != value.text else ""
        return f"    <{tag} value={quoteattr(value.text)}{alias}/>"

    lines = ["<View>", f"  <Image name={quoteattr(project.image)} value={quoteattr('$' + project.image_key)}/>"]
    if project.boxes:
        lines.append(f"  <RectangleLabels name={quoteattr(project.boxes)} toName={quoteattr(project.image)}>")
        lines += [option("Label", label) for label in project.labels]
        lines.append("  </RectangleLabels>")
    for shape in project.shapes:
        tag = "BrushLabels" if shape.kind == "brush" else "PolygonLabels"
        lines.append(f"  <{tag} name={quoteattr(shape.name)} toName={quoteattr(project.image)}>")
        lines += [option("Label", label) for label in shape.labels]
        lines.append(f"  </{tag}>")
    for name, values in project.region_choices.items():
        lines.append(f'  <Choices name={quoteattr(name)} toName={quoteattr(project.image)} perRegion="true">')
        lines += [option("Choice", value) for value in values]
        lines.append("  </Choices>")
    for choices in project.image_choices:
        kind = ' choice="multiple"' if choices.multiple else ""
        lines.append(f"  <Choices name={quoteattr(choices.name)} toName={quoteattr(project.image)}{kind}>")
        lines += [option("Choice", value) for value in choices.options]
        lines.append("  </Choices>")
    if project.caption:
        lines.append(f"  <TextArea name={quoteattr(project.caption)} toName={quoteattr(project.image)}/>")
    return "\n".join([*lines, "</View>"]) + "\n"
