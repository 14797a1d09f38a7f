"""Labels a person reviewed, read for `annotate evaluate`: a COCO detection file, a Label Studio export (JSON) of a
project's annotations, or a YOLO dataset; and their images matched to the pipeline's, by URI, by file name, or by
the ``<image_id>.<ext>`` names the project's own exports give them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from shared.errors import RequestRejected
from shared.serving.label_studio import LabelledBox
from tools.results.annotations import AnnotatedImage

# Label Studio's control names in the project's own label config (tools/results/export.py): a per-region Choices named
# so is the box's class; any other per-region Choices an attribute; a TextArea the caption.
CLASS_CONTROL = "class"


@dataclass(frozen=True)
class TruthImage:
    """One image as a person labelled it: ``key`` names it (a URI or a file name)."""

    key: str
    boxes: list[LabelledBox] = field(default_factory=list)
    caption: str | None = None
    relative: bool = False  # boxes in fractions of the image's sides (YOLO's), scaled once the image is matched

    def in_pixels(self, width: int, height: int) -> TruthImage:
        if not self.relative:
            return self
        boxes = [
            replace(box, x0=box.x0 * width, x1=box.x1 * width, y0=box.y0 * height, y1=box.y1 * height)
            for box in self.boxes
        ]
        return replace(self, boxes=boxes, relative=False)


def read_truth(path: Path) -> list[TruthImage]:
    """The images of a COCO file, a Label Studio JSON export, or a YOLO dataset (its data.yaml, or its folder).

    Raises:
        RequestRejected: the file is missing, not JSON, or neither format.
    """
    if path.is_dir() or path.suffix in {".yaml", ".yml"}:
        return _yolo_truth(path if path.is_dir() else path.parent)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError as missing:
        raise RequestRejected(f"{path}: no such file") from missing
    except (OSError, ValueError) as unreadable:
        raise RequestRejected(f"{path}: not a JSON file ({unreadable})") from unreadable
    try:
        if isinstance(document, dict) and {"images", "annotations"} <= document.keys():
            return _coco_truth(document)
        if isinstance(document, list) and all(isinstance(task, dict) and "data" in task for task in document):
            return _label_studio_truth(document)
    except (KeyError, TypeError, ValueError, IndexError) as malformed:
        raise RequestRejected(f"{path}: a malformed {type(document).__name__} of labels ({malformed!r})") from None
    raise RequestRejected(f"{path}: neither a COCO file (images, annotations) nor a Label Studio export (tasks)")


def _yolo_truth(folder: Path) -> list[TruthImage]:
    """A YOLO dataset's labels (``labels/<stem>.txt``: class, centre x, centre y, width, height, in fractions of
    the image), each image named by its stem (the project's export names them by image id).

    Raises:
        RequestRejected: no data.yaml with names, or a label line that is not five numbers of a known class.
    """
    import yaml

    try:
        names = yaml.safe_load((folder / "data.yaml").read_text())["names"]
        names = names if isinstance(names, dict) else dict(enumerate(names))
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise RequestRejected(f"{folder}: not a YOLO dataset (data.yaml with names: {error})") from None
    images = []
    for labels in sorted((folder / "labels").glob("*.txt")):
        boxes = []
        for number, line in enumerate(labels.read_text().splitlines(), start=1):
            try:
                category, cx, cy, width, height = line.split()
                x, y, w, h = (float(value) for value in (cx, cy, width, height))
                label = str(names[int(category)])
            except (ValueError, KeyError) as error:
                raise RequestRejected(f"{labels}:{number}: not a YOLO box of a known class ({error})") from None
            boxes.append(LabelledBox(label, 1.0, x - w / 2, y - h / 2, x + w / 2, y + h / 2, None, None))
        images.append(TruthImage(key=f"{labels.stem}.txt", boxes=boxes, relative=True))
    return images


def _coco_truth(document: dict[str, Any]) -> list[TruthImage]:
    names = {category["id"]: category["name"] for category in document.get("categories", [])}
    boxes: dict[Any, list[LabelledBox]] = {image["id"]: [] for image in document["images"]}
    captions: dict[Any, str] = {}
    for annotation in document["annotations"]:
        if "caption" in annotation:  # COCO's captions format
            captions[annotation["image_id"]] = annotation["caption"]
        if "bbox" not in annotation:
            continue
        x, y, width, height = (float(value) for value in annotation["bbox"])
        attributes = dict(annotation.get("attributes") or {})
        class_label = attributes.pop(CLASS_CONTROL, None)
        boxes[annotation["image_id"]].append(
            LabelledBox(
                label=names[annotation["category_id"]],
                score=float(annotation.get("score", 1.0)),
                x0=x,
                y0=y,
                x1=x + width,
                y1=y + height,
                class_label=class_label,
                class_score=None,
                attributes={name: str(value) for name, value in attributes.items() if value},
            )
        )
    return [
        TruthImage(key=image["file_name"], boxes=boxes[image["id"]], caption=captions.get(image["id"]))
        for image in document["images"]
    ]


def _label_studio_truth(tasks: list[dict[str, Any]]) -> list[TruthImage]:
    """Each task's latest annotation that was not cancelled (a task nobody annotated is no truth, and is left out)."""
    images = []
    for task in tasks:
        done = [a for a in task.get("annotations", []) if not a.get("was_cancelled")]
        if not done:
            continue
        result = done[-1].get("result", [])
        regions: dict[str, dict[str, Any]] = {}
        caption = None
        for item in result:
            value = item.get("value", {})
            if item.get("type") == "rectanglelabels":
                regions.setdefault(item["id"], {})["box"] = item
            elif item.get("type") == "choices" and "id" in item:
                regions.setdefault(item["id"], {}).setdefault("choices", {})[item["from_name"]] = value["choices"][0]
            elif item.get("type") == "textarea":
                caption = " ".join(value.get("text", []))
        boxes = []
        for region in regions.values():
            if "box" not in region:
                continue
            item = region["box"]
            value, width, height = item["value"], float(item["original_width"]), float(item["original_height"])
            choices = dict(region.get("choices", {}))
            boxes.append(
                LabelledBox(
                    label=value["rectanglelabels"][0],
                    score=1.0,
                    x0=value["x"] * width / 100,
                    y0=value["y"] * height / 100,
                    x1=(value["x"] + value["width"]) * width / 100,
                    y1=(value["y"] + value["height"]) * height / 100,
                    class_label=choices.pop(CLASS_CONTROL, None),
                    class_score=None,
                    attributes=choices,
                )
            )
        image = next(iter(task["data"].values())) if "image" not in task["data"] else task["data"]["image"]
        images.append(TruthImage(key=str(image), boxes=boxes, caption=caption))
    return images


def match_images(
    truth: list[TruthImage], predicted: list[AnnotatedImage]
) -> tuple[list[tuple[TruthImage, AnnotatedImage]], list[str]]:
    """Each truth image with the pipeline's image it names, and the keys of those that name none.

    A key names an image by its URI, by its file name (when one image has it), or as the project's exports name
    its picture (``images/<image_id>.<ext>``)."""
    by_uri = {image.source_uri: image for image in predicted}
    by_id = {image.image_id: image for image in predicted}
    names = Counter(PurePosixPath(image.source_uri).name for image in predicted)
    by_name = {PurePosixPath(i.source_uri).name: i for i in predicted if names[PurePosixPath(i.source_uri).name] == 1}
    matched, unmatched = [], []
    for image in truth:
        name = PurePosixPath(image.key.split("?", 1)[0]).name
        found = by_uri.get(image.key) or by_id.get(PurePosixPath(name).stem) or by_name.get(name)
        if found is None:
            unmatched.append(image.key)
        else:
            matched.append((image, found))
    return matched, unmatched


def unmatched_refusal(unmatched: list[str], truth: list[TruthImage]) -> RequestRejected:
    return RequestRejected(
        f"{len(unmatched)} of the {len(truth)} labelled images were not annotated by the pipeline (the first: "
        f"{unmatched[0]}): annotate them first, or leave them out of the truth file"
    )
